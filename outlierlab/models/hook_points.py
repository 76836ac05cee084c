"""Every activation of a model by one name: the site registry behind ``ol.sites``, ``ol.run_with_cache`` and
``ol.run_with_hooks`` (``outlierlab.site_runs``, ``scored_runs``), for our encoder (post-LN, pre-LN,
Outlier-Protected blocks) and every family of ``outlierlab.models.families`` (BERT, RoBERTa, ELECTRA, DeBERTa, MPNet,
DistilBERT, ModernBERT, GPT-2, Pythia, Llama, Mistral, Qwen, OLMo).

The names follow TransformerLens (Nanda & Bloom 2022) where the meaning is the same, without its ``hook_``
prefixes; a site a model lacks is absent.  **Blocks are numbered from 1, as hidden states are** (block ``i``
produces hidden state ``i``; the tables of evaluate.py number layers so, and ``ablation.layers`` too), so
``blocks.{i}.resid`` is ``output_hidden_states[i]``; TransformerLens counts blocks from 0.

The sites (docs/sites.md has them with their shapes): ``embed`` (hidden state 0, the first block's input);
``ln_embed`` (the embeddings' norm); per block ``blocks.{i}.attn.in`` (the q/k/v projections' input:
TransformerLens's ``hook_attn_in``), ``attn.q`` / ``k`` / ``v`` (the projections' outputs before heads are split,
QK-norms or rotary positions; of a fused projection its slice), ``attn.pattern`` (the probabilities; the runner
switches to eager attention), ``attn.z`` (the output projection's input, heads merged: TL's ``hook_z``),
``attn.out`` (the attention's update before dropout and the residual add), ``ln_attn`` (the attention norm's output:
post-LN after the attention's residual add, pre-LN before the attention, reordered on its update), ``ffn.in`` (the
FFN's first projections' input: TL's ``hook_mlp_in``), ``ffn.pre`` (the FFN's first projection before its
activation; gated: the gate's), ``ffn.post`` (the down-projection's input), ``ffn.out`` (its output before dropout
and the residual add; Bondarenko et al. 2023's ``ffn_output``), ``ln_ffn.in`` (the FFN norm's input), ``ln_ffn``
(the FFN norm's output: post-LN the output LayerNorm, Kovaleva et al.'s, = ``resid``; pre-LN before the FFN;
reordered on its update) and ``resid`` (the block's output: ``output_hidden_states[i]``, but for the last block of a
model with a final norm); ``ln_final`` (the final norm's output, ``last_hidden_state``) and ``ln_head`` (the LM
head's own norm).

Each site is a module's output or first input (``embed``, ``ln_ffn.in`` and the linear layers' inputs), so a hook
that returns a new tensor changes exactly what the name says downstream. Every linear layer of a block reads one of
``LINEAR_INPUT_SITES`` (``attn.in``, ``attn.z``, ``ffn.in``, ``ffn.post``); where several read one activation
(separate q/k/v, a gated FFN's gate and up projections) the hook runs at each one's input. The one site that cannot
be replaced is a Hugging Face ``attn.pattern``: transformers computes the probabilities inside a function and
returns them after they weighed the values, so there the site can be read, not replaced (refused in one line); our
encoder marks them with a module (``attention.self.pattern``), replaceable.

The norm sites are the norms of ``outlierlab.models.layernorms.model_layernorms`` (``norm_site`` maps their keys), so a
dimension ablated here is one the LayerNorm rule judged.  Written by hand because neither transformers nor torch names a
model's activations across architectures; TransformerLens does for the models it reimplements, which include no RoBERTa
and no masked-LM loss.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from torch import Tensor, nn

from outlierlab.models.families import UnknownFamilyError, family_of
from outlierlab.models.family_spec import Family, submodule

__all__ = ["BLOCK_SITES", "LINEAR_INPUT_SITES", "Site", "HookPoint", "HookFn", "site_table", "site_names",
           "resolve_sites", "norm_site", "hidden_state_sites", "attached", "site_means"]

#: A hook: ``fn(activation, point) -> Tensor | None`` (None: the activation goes on as it is).
HookFn = Callable[[Tensor, "HookPoint"], "Tensor | None"]

_KIND_SLOT = {"attention_output": "ln_attn", "attention_input": "ln_attn", "attention_update": "ln_attn",
              "output": "ln_ffn", "mlp_input": "ln_ffn", "mlp_update": "ln_ffn"}
_LAYER = re.compile(r"^layer\.(\d+)\.(\w+)$")
#: The sites of one block, in the order ``site_table`` lists them.
BLOCK_SITES = ("attn.in", "attn.q", "attn.k", "attn.v", "attn.pattern", "attn.z", "attn.out", "ln_attn", "ffn.in",
               "ffn.pre", "ffn.post", "ffn.out", "ln_ffn.in", "ln_ffn", "resid")
#: The block sites that are linear layers' inputs: every linear of a block reads one (W8A8 rounds them there).
LINEAR_INPUT_SITES = ("attn.in", "attn.z", "ffn.in", "ffn.post")


@dataclass(frozen=True)
class Site:
    """Where one named activation is read.

    name : the site's name
    module : the module whose output (``where="output"``) or first input (``"input"``) it is
    also : further modules whose first input is the same activation (separate q/k/v projections, a gated FFN's
        gate and up projections): a hook runs at each one's input, and each receives what it returns
    item : the element of a tuple output (a block's ``(hidden, ...)``: 0; an attention's probabilities: 1)
    part : a slice of a fused projection's output: ``(layout, index, sizes, head_dim)`` with layout ``qkv``
        (``[q | k | v]``) or ``head_qkv`` (per head ``[q_h | k_h | v_h]``, GPT-NeoX), index 0/1/2 = q/k/v
    layer : the hidden state it belongs to: 0 for the embeddings, ``i`` for block ``i``; None for the final and
        head norms
    layout : ``tokens`` (``[B, T, ...]``) or ``pattern`` (``[B, H, T, T]``)
    writable : whether a hook may replace it (a Hugging Face attention pattern may not: see the module docstring)
    """

    name: str
    module: nn.Module
    where: str = "output"
    also: tuple[nn.Module, ...] = ()
    item: int = 0
    part: tuple | None = None
    layer: int | None = None
    layout: str = "tokens"
    writable: bool = True


@dataclass
class HookPoint:
    """What a hook receives beside the activation: the site, and the batch being run.

    ``batch`` (its number), ``texts`` (the indices of its rows among the texts of the run) and ``attention_mask``
    (``[B, T]``) are set by the runner (``outlierlab.site_runs``) before each forward; a hook attached by hand
    (``attached``) sees them as None unless the caller sets them (``points[name].batch = ...``)."""

    name: str
    layer: int | None = None
    batch: int | None = None
    texts: Tensor | None = None
    attention_mask: Tensor | None = None
    layout: str = "tokens"


# ------------------------------------------------------------------------------------------------ the registry
def model_family(model: nn.Module) -> Family:
    """The family of ``model`` (``family_of``), its error naming the sites."""
    try:
        return family_of(model)
    except UnknownFamilyError as e:
        raise UnknownFamilyError(f"no named sites for {type(model).__name__}: {e}") from None


def norm_site(key: str) -> str:
    """The site of a norm by its canonical key (``outlierlab.models.layernorms.model_layernorms``):
    ``embeddings`` -> ``ln_embed``, ``layer.{i}.<kind>`` -> ``blocks.{i+1}.ln_attn`` / ``ln_ffn`` (0-based norm
    keys, 1-based blocks), ``final`` -> ``ln_final``, ``head`` -> ``ln_head``."""
    fixed = {"embeddings": "ln_embed", "final": "ln_final", "head": "ln_head"}
    if key in fixed:
        return fixed[key]
    m = _LAYER.match(key)
    if not m or m.group(2) not in _KIND_SLOT:
        raise ValueError(f"{key!r} is not a norm key (embeddings, layer.<i>.<kind>, final, head)")
    return f"blocks.{int(m.group(1)) + 1}.{_KIND_SLOT[m.group(2)]}"


def _heads(model: nn.Module, family: Family) -> tuple[int, int, int]:
    """(heads, key/value heads, head dim) from the config (``Family.qk_projections`` reads them)."""
    proj = family.qk_projections(model)[0]
    return proj.num_heads, proj.num_kv_heads, proj.head_dim


def site_table(model: nn.Module) -> dict[str, Site]:
    """Every site of ``model`` by name, in depth order (see the module docstring).

    ``model``: our ``RobertaMaskedLM`` or ``RobertaEncoder``, or a Hugging Face model of a registered family, with
    or without its LM head (``ln_head`` only with it); an unregistered ``model_type`` raises ``UnknownFamilyError``.
    """
    family = model_family(model)
    blocks = family.block_list(model)
    norms = {norm_site(k): m for k, m in family.layernorms(model, include_head=True).items()}
    table: dict[str, Site] = {"embed": Site("embed", blocks[0], "input", layer=0)}
    if "ln_embed" in norms:
        table["ln_embed"] = Site("ln_embed", norms["ln_embed"], layer=0)
    heads, kv, dh = _heads(model, family)
    sizes = (heads * dh, kv * dh, kv * dh)
    fused = family.qk_layout in ("qkv", "head_qkv")
    for i, block in enumerate(blocks, start=1):
        p = f"blocks.{i}."
        _add_input(table, p + "attn.in", block, (family.q, family.k, family.v), i)
        for j, (slot, path) in enumerate((("q", family.q), ("k", family.k), ("v", family.v))):
            module = submodule(block, path)
            if module is not None:
                part = (family.qk_layout, j, sizes, dh) if fused else None
                table[p + f"attn.{slot}"] = Site(p + f"attn.{slot}", module, part=part, layer=i)
        marker = submodule(block, "attention.self.pattern") if family.name == "outlierlab" else None
        if marker is not None:  # ours: the probabilities' own module, before they weigh the values
            table[p + "attn.pattern"] = Site(p + "attn.pattern", marker, layer=i, layout="pattern")
        elif (attention := submodule(block, family.attention)) is not None and family.name != "outlierlab":
            table[p + "attn.pattern"] = Site(p + "attn.pattern", attention, item=1, layer=i, layout="pattern",
                                             writable=False)
        if (out := submodule(block, family.attention_out)) is not None:
            table[p + "attn.z"] = Site(p + "attn.z", out, "input", layer=i)
            table[p + "attn.out"] = Site(p + "attn.out", out, layer=i)
        if p + "ln_attn" in norms:
            table[p + "ln_attn"] = Site(p + "ln_attn", norms[p + "ln_attn"], layer=i)
        _add_input(table, p + "ffn.in", block, (family.ffn_input, family.ffn_up), i)
        if (up := submodule(block, family.ffn_input)) is not None:
            table[p + "ffn.pre"] = Site(p + "ffn.pre", up, layer=i)
        if (down := submodule(block, family.ffn_output)) is not None:
            table[p + "ffn.post"] = Site(p + "ffn.post", down, "input", layer=i)
            table[p + "ffn.out"] = Site(p + "ffn.out", down, layer=i)
        if p + "ln_ffn" in norms:
            table[p + "ln_ffn.in"] = Site(p + "ln_ffn.in", norms[p + "ln_ffn"], "input", layer=i)
            table[p + "ln_ffn"] = Site(p + "ln_ffn", norms[p + "ln_ffn"], layer=i)
        table[p + "resid"] = Site(p + "resid", block, layer=i)
    for name in ("ln_final", "ln_head"):
        if name in norms:
            table[name] = Site(name, norms[name])
    return table


def _add_input(table: dict[str, Site], name: str, block: nn.Module, paths: Sequence[str], layer: int) -> None:
    """The site ``name``: the first input of the modules at ``paths`` in ``block`` (a fused projection's one module),
    where the block has them."""
    modules = list({id(m): m for m in (submodule(block, path) for path in paths) if m is not None}.values())
    if modules:
        table[name] = Site(name, modules[0], "input", also=tuple(modules[1:]), layer=layer)


def site_names(model: nn.Module) -> list[str]:
    """The names of every site of ``model``, in depth order (``site_table``)."""
    return list(site_table(model))


def hidden_state_sites(model: nn.Module) -> list[str]:
    """The ``L + 1`` sites equal to ``output_hidden_states``: ``embed``, ``blocks.{i}.resid``, and for the last
    hidden state of a model with a final norm (Hugging Face puts ``last_hidden_state`` there) ``ln_final``."""
    names = site_names(model)
    blocks = [n for n in names if n.endswith(".resid")]
    return ["embed", *blocks[:-1], "ln_final" if "ln_final" in names else blocks[-1]]


def resolve_sites(table: Mapping[str, Site], names: Iterable[str] | str | None, what: str = "sites",
                  default: Callable[[Site], bool] | None = None) -> list[str]:
    """``names`` checked against ``table``, in depth order; each may be a glob (``blocks.*.resid``).  None: the
    sites ``default`` keeps (every one).  An unknown name is one line listing the valid ones."""
    if names is None:
        return [n for n, s in table.items() if default is None or default(s)]
    if isinstance(names, (str, bytes)):
        raise TypeError(f"{what}={names!r} is a single string: pass a list, e.g. {what}=[{names!r}]")
    chosen: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: {name!r} is not a site name (a string)")
        hits = [n for n in table if fnmatch.fnmatchcase(n, name)] if any(c in name for c in "*?[") else \
            ([name] if name in table else [])
        if not hits:
            raise ValueError(f"unknown site {name!r}; valid: {_listing(table)}")
        chosen += hits
    return [n for n in table if n in set(chosen)]


def _listing(table: Mapping[str, Site]) -> str:
    """The valid names in one line: the embeddings' sites, each block site as ``blocks.{1..L}.<name>`` (a site only
    some blocks have -- ModernBERT's first block has no attention norm -- with those blocks), the final ones."""
    out = [n for n, s in table.items() if s.layer == 0]
    for suffix in BLOCK_SITES:
        layers = [int(n.split(".")[1]) for n in table if n.startswith("blocks.") and n.split(".", 2)[2] == suffix]
        if layers:
            span = f"{layers[0]}..{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else \
                ",".join(map(str, layers))
            out.append(f"blocks.{layers[0]}.{suffix}" if len(layers) == 1 else f"blocks.{{{span}}}.{suffix}")
    return ", ".join([*out, *(n for n, s in table.items() if s.layer is None)])


# -------------------------------------------------------------------------------------------------- the hooks
def _part(x: Tensor, part: tuple) -> Tensor:
    """The slice of a fused projection's output ``x`` that ``part`` names: a view where ``x`` is contiguous."""
    layout, j, sizes, dh = part
    if layout == "qkv":
        start = sum(sizes[:j])
        return x[..., start:start + sizes[j]]
    return x.reshape(*x.shape[:-1], -1, 3 * dh)[..., j * dh:(j + 1) * dh]  # head_qkv: per head [q_h | k_h | v_h]


def _take(site: Site, value):
    """The activation of ``site`` inside what its hook sees (a tuple, a fused projection's output)."""
    x = value[site.item] if isinstance(value, (tuple, list)) else value
    return x if site.part is None else _part(x, site.part).reshape(*x.shape[:-1], -1)


def _put(site: Site, value, new: Tensor):
    """``value`` with the activation of ``site`` replaced by ``new`` (a new tuple / a new fused output)."""
    x = value[site.item] if isinstance(value, (tuple, list)) else value
    if site.part is not None:
        out = x.clone()
        view = _part(out, site.part)
        view[...] = new.reshape(view.shape)
        new = out
    if isinstance(value, (tuple, list)):
        items = list(value)
        items[site.item] = new
        return tuple(items) if isinstance(value, tuple) else items
    return new


def _apply(site: Site, point: HookPoint, fns: Sequence[HookFn], value):
    for fn in fns:
        x = _take(site, value)
        new = fn(x, point)
        if new is None or new is x:
            continue
        if not isinstance(new, Tensor):
            raise TypeError(f"the hook at {site.name} returned a {type(new).__name__}: return a tensor or None")
        if not site.writable:
            raise ValueError(f"{site.name} can be read, not replaced, in this model: transformers computes the "
                             "attention probabilities inside a function and returns them after use (hook "
                             "attn.q/k/v or attn.out instead)")
        if new.shape != x.shape:
            raise ValueError(f"the hook at {site.name} returned shape {tuple(new.shape)} for an activation of "
                             f"shape {tuple(x.shape)}")
        value = _put(site, value, new.to(x.dtype))
    return value


@contextmanager
def attached(model: nn.Module, hooks: Mapping[str, HookFn | Sequence[HookFn]], table: Mapping[str, Site] | None = None):
    """Inside the block, every forward of ``model`` calls ``hooks[site](activation, point)`` at each named site
    (a list: each in turn, each seeing what the one before returned) and goes on with what it returns (None: the
    activation unchanged).  Yields ``{site: HookPoint}``, the points the hooks receive (the runner sets their
    batch).  The hooks are removed on exit, also when the body raises.

    Examples
    --------
    >>> from outlierlab.models.interventions import zero            # doctest: +SKIP
    >>> with attached(model, {"blocks.2.ln_ffn": zero([308, 381])}):
    ...     out = model(**batch)
    """
    table = site_table(model) if table is None else table
    resolve_sites(table, list(hooks), "hooks")
    points = {name: HookPoint(name, table[name].layer, layout=table[name].layout) for name in hooks}
    handles = []
    try:
        for name, fns in hooks.items():
            fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
            bad = [f for f in fns if not callable(f)]
            if bad:
                raise TypeError(f"hooks[{name!r}] is not callable ({type(bad[0]).__name__}): give a function "
                                "fn(activation, point) -> tensor or None")
            site, point = table[name], points[name]
            if site.where == "input":
                def pre(_m, args, kwargs, site=site, point=point, fns=fns):
                    if args:
                        return (_apply(site, point, fns, args[0]), *args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": _apply(site, point, fns, kwargs["hidden_states"])}

                handles += [m.register_forward_pre_hook(pre, with_kwargs=True) for m in (site.module, *site.also)]
            else:
                def post(_m, _args, out, site=site, point=point, fns=fns):
                    return _apply(site, point, fns, out)

                handles.append(site.module.register_forward_hook(post))
        yield points
    finally:
        for h in handles:
            h.remove()


@dataclass
class _MeanReader:
    """A hook that adds up an activation over the real tokens of each batch (float64)."""

    total: Tensor | None = None
    count: int = 0

    def __call__(self, x: Tensor, point: HookPoint) -> None:
        mask = point.attention_mask
        if mask is not None and x.shape[:2] == tuple(mask.shape) and point.layout == "tokens":
            rows = x[mask.to(x.device).bool()]
        else:  # rows of their own (a head run on the scored rows alone): every row is a real token
            rows = x.reshape(-1, x.shape[-1])
        s = rows.double().sum(0).cpu()
        self.total = s if self.total is None else self.total + s
        self.count += rows.shape[0]


def site_means(model: nn.Module, sites: Sequence[str], forward: Callable[[dict], object],
               batches: Iterable[Mapping[str, Tensor]], table: Mapping[str, Site] | None = None) -> dict[str, Tensor]:
    """Each site's mean activation ``[d]`` (float32) over the real tokens (``attention_mask`` 1) of ``batches``,
    run by ``forward(batch)``: the value Sun et al. (2024, "Massive Activations in Large Language Models") set a
    dimension to when they ablate it (set-to-mean, beside Kovaleva et al.'s set-to-zero)."""
    table = site_table(model) if table is None else table
    readers = {name: _MeanReader() for name in sites}
    with attached(model, readers, table) as points:
        for batch in batches:
            for point in points.values():
                point.attention_mask = batch["attention_mask"]
            forward(batch)
    missing = [n for n, r in readers.items() if not r.count]
    if missing:
        raise ValueError(f"no token reached {', '.join(missing)}: the forward does not pass there")
    return {n: (r.total / r.count).float() for n, r in readers.items()}
