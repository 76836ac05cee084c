"""The one build step pyproject.toml cannot state: the wheel carries the repository's ``configs/`` as
``outlierlab/configs/``, so the Python API (``ol.evaluate``, ``ol.probe_positions``) composes the same configs from a
regular ``pip install`` as from a clone.  package-data cannot name a folder outside the package; an editable install
reads the repository's ``configs/`` directly (``outlierlab.configuration.overrides.CONFIG_DIR``) and copies nothing.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        source = Path(__file__).resolve().parent / "configs"
        if source.is_dir():  # an sdist without configs/ builds a wheel the API tells what is missing
            shutil.copytree(source, Path(self.build_lib) / "outlierlab" / "configs", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithConfigs})
