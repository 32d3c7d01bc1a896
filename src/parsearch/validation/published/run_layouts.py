"""The layout and setup of a published run: its cells, blank-cell defaults, and sanity checks.

:func:`build_layout` reads the parallel degrees, micro-batch size, sequence
parallelism and recompute of a row, filling blank cells with documented
defaults (each returned as an assumption); :func:`layout_problems` says why
a layout cannot be what ran; :func:`normalise_precision` maps a published
precision string to ``bf16`` / ``fp8`` / ``fp4`` and the FP8 recipe.
"""

from __future__ import annotations

from parsearch.errors import SpecError
from parsearch.layout import Layout
from parsearch.model.specs import ModelSpec, Precision, Recompute
from parsearch.validation.published.run_cells import Row, cell_int, cell_text, required_int
from parsearch.validation.published.run_conventions import FOLD, LLAMA3, MBRIDGE, TORCHTITAN

#: The assumption note of a torchtitan row read with torchtitan's op-level checkpointing.
TITAN_OP_SAC_NOTE = "recompute priced as torchtitan's op-level selective checkpointing"
TITAN_LAYER_SAC_NOTE = "recompute priced as torchtitan's per-layer checkpointing"


def normalise_precision(raw: str) -> tuple[Precision, str | None]:
    """Map a published precision string to (``bf16``|``fp8``|``fp4``, FP8 recipe).

    16-bit formats (BF16, FP16 mixed) all map to ``bf16``; the recipe is
    ``None`` except for FP8.

    >>> normalise_precision("FP8-MX")
    ('fp8', 'mxfp8')
    >>> normalise_precision("FP16 mixed")
    ('bf16', None)
    """
    text = raw.strip().upper()
    if "FP4" in text:
        return "fp4", None
    if "FP8" in text:
        return "fp8", _fp8_recipe(text)
    if text in ("BF16", "FP16", "FP16 MIXED", "MIXED 16-BIT"):
        return "bf16", None
    raise SpecError(f"published run: unknown precision {raw!r}")


def _fp8_recipe(text: str) -> str:
    if "MX" in text:
        return "mxfp8"
    if "BLOCKWISE" in text:
        return "blockwise"
    if "ROWWISE" in text:  # torchao float8 rowwise scaling (torchtitan rows)
        return "rowwise"
    if "TENSORWISE" in text:
        return "tensorwise"
    if "DELAYED" in text:
        return "delayed"
    if text.endswith("-CS"):
        return "tensorwise"
    if "SEE NOTE" in text:
        return "tensorwise (presumed)"
    return "unspecified"


def _recompute(text: str) -> Recompute:
    lowered = text.lower()
    if lowered.startswith("full"):
        return "full"
    if lowered.startswith("selective"):
        return "selective"
    if lowered in ("", "none", "no"):
        return "none"
    raise SpecError(f"published run: unknown recompute {text!r}")


# --------------------------------------------------------------------------- layout


def build_layout(row: Row, tag: str, moe_row: bool) -> tuple[Layout, list[str]]:
    """The row's :class:`Layout` and the defaults used for its blank cells."""
    notes: list[str] = []
    tp = cell_int(row, "tp") or 1
    pp = cell_int(row, "pp") or 1
    ep = cell_int(row, "ep") or 1
    etp = _etp(row, tag, moe_row, tp, notes)
    vpp = cell_int(row, "vpp")
    if vpp is None:
        vpp = _llama3_vpp(row, pp, notes) if tag == LLAMA3 else 1
        if pp > 1 and vpp == 1:
            notes.append("vpp not stated: 1 (no interleaving)")
    mbs = cell_int(row, "micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch size not stated: 1")
    recompute_text = cell_text(row, "recompute")
    if not recompute_text:
        recompute_text = _llama3_recompute(row, notes) if tag == LLAMA3 else ""
    if not recompute_text:
        notes.append("recompute not stated: none")
    elif tag == TORCHTITAN and recompute_text.lower().startswith("selective"):
        if "layer" in recompute_text.lower():
            # torchtitan's per-layer SAC checkpoints every N-th block whole; its configs
            # set N = 2 (train_configs/llama3_*.toml of 2024: selective_ac_option = '2'):
            # half the blocks recomputed in full, the others keep their activations, which
            # Megatron's block method over half the layers prices the same
            notes.append(f"{TITAN_LAYER_SAC_NOTE} ({recompute_text!r}): every second block "
                         "fully recomputed (selective_ac_option '2'), priced as full "
                         "recompute of half the layers")
        else:
            # torchtitan's op-level SAC, its configs' default for selective
            # (train_configs/llama3_*.toml: selective_ac_option = 'op')
            notes.append(f"{TITAN_OP_SAC_NOTE} ({recompute_text!r}): every second matmul, "
                         "the elementwise ops and the SP all-gathers recomputed")
    return (
        Layout(
            num_gpus=required_int(row, "num_gpus"),
            tp=tp,
            pp=pp,
            cp=cell_int(row, "cp") or 1,
            ep=ep,
            etp=etp,
            vpp=vpp,
            mbs=mbs,
            sp=_sequence_parallel(row, tp, notes),
            recompute=("full" if any(n.startswith(TITAN_LAYER_SAC_NOTE) for n in notes)
                       else _recompute(recompute_text)),
        ),
        notes,
    )


def _llama3_vpp(row: Row, pp: int, notes: list[str]) -> int:
    """Virtual stages per rank the Llama 3 paper's text implies (its Table 4 gives none).

    §3.3.2 (arXiv 2407.21783): "one Transformer layer is reduced each from the first
    and the last stages ... the first model chunk on the first stage has only the
    embedding, and the last model chunk on the last stage has only output projection
    and loss" -- one unit per model chunk, so pp·V = layers + 2 (embedding, loss).
    """
    layers = cell_int(row, "num_layers")
    if pp <= 1 or layers is None or (layers + 2) % pp:
        return 1
    vpp = (layers + 2) // pp
    notes.append(f"vpp not stated: {vpp} (Llama 3 §3.3.2: one layer per model chunk, "
                 f"embedding and loss a chunk each: ({layers}+2)/{pp})")
    return vpp


def _llama3_recompute(row: Row, notes: list[str]) -> str:
    """Recompute the Llama 3 paper states: none at 8K tokens (§3.3.2); "" when unstated."""
    seq = cell_int(row, "seq_length")
    if seq is None or seq > 8192:
        return ""
    notes.append("recompute from the text: none (Llama 3 §3.3.2: 8K sequences "
                 "pre-trained without activation checkpointing)")
    return "none"


def _etp(row: Row, tag: str, moe_row: bool, tp: int, notes: list[str]) -> int:
    etp = cell_int(row, "etp")
    if etp is not None:
        return etp
    if not moe_row:
        return 1
    if tag == FOLD:
        notes.append("etp not stated: = tp (no folding couples expert TP to TP)")
        return tp
    notes.append("etp not listed by NVIDIA: 1" if tag == MBRIDGE else "etp not stated: 1")
    return 1


def _sequence_parallel(row: Row, tp: int, notes: list[str]) -> bool:
    text = cell_text(row, "sequence_parallel").lower()
    if text in ("yes", "true", "1"):
        return True
    if text in ("no", "false", "0"):
        return False
    if tp > 1:
        notes.append("sequence parallel not stated: on (tp > 1)")
    return tp > 1


def layout_problems(
    layout: Layout,
    model: ModelSpec | None,
    seq_len: int,
    global_batch: int,
    stated_dp: int | None = None,
) -> list[str]:
    """Why a published layout cannot be what ran, as short sentences (empty if fine).

    Checks the world-size algebra (dense and expert mesh), the stated DP,
    the batch split and the divisibility a Megatron run cannot violate.
    """
    problems = _mesh_problems(layout, model, stated_dp)
    if layout.dp and global_batch % (layout.mbs * layout.dp):
        problems.append(
            f"global_batch={global_batch} is not a multiple of mbs·dp={layout.mbs * layout.dp}"
        )
    if layout.vpp > 1 and layout.pp == 1:
        problems.append(f"vpp={layout.vpp} needs pp > 1")
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        problems.append(f"seq_len={seq_len} is not a multiple of 2·cp={2 * layout.cp}")
    if layout.sp and layout.tp == 1:
        problems.append("sequence parallel needs tp > 1")
    if model is not None:
        problems.extend(_model_problems(layout, model))
    return problems


def _mesh_problems(layout: Layout, model: ModelSpec | None, stated_dp: int | None) -> list[str]:
    problems: list[str] = []
    dense = layout.tp * layout.cp * layout.pp
    if layout.num_gpus % dense:
        problems.append(f"num_gpus={layout.num_gpus} is not a multiple of tp·cp·pp={dense}")
    elif stated_dp is not None and stated_dp != layout.dp:
        problems.append(
            f"stated dp={stated_dp} but num_gpus/(tp·cp·pp)={layout.dp} "
            f"(tp·cp·dp·pp={dense * stated_dp} ≠ {layout.num_gpus})"
        )
    expert = layout.pp * layout.ep * layout.etp
    if layout.num_gpus % expert:
        problems.append(f"num_gpus={layout.num_gpus} is not a multiple of pp·ep·etp={expert}")
    if model is not None and model.moe is None and (layout.ep > 1 or layout.etp > 1):
        problems.append(f"ep={layout.ep}, etp={layout.etp} on a dense model")
    return problems


def _model_problems(layout: Layout, model: ModelSpec) -> list[str]:
    problems: list[str] = []
    if model.num_attention_heads % layout.tp:
        problems.append(f"heads={model.num_attention_heads} not divisible by tp={layout.tp}")
    # As constraint R8 (uneven split): the embedding and the loss may each take a virtual
    # stage (Megatron account_for_embedding/loss_in_pipeline_split; Llama 3 §3.3.2).
    if layout.pp * layout.vpp > model.num_layers + 2:
        problems.append(f"pp·vpp={layout.pp * layout.vpp} exceeds "
                        f"num_layers+2={model.num_layers + 2}")
    moe = model.moe
    if moe is not None:
        if moe.num_experts % layout.ep:
            problems.append(f"num_experts={moe.num_experts} not divisible by ep={layout.ep}")
        if moe.expert_ffn_hidden_size % layout.etp:
            problems.append(
                f"expert ffn={moe.expert_ffn_hidden_size} not divisible by etp={layout.etp}"
            )
    return problems
