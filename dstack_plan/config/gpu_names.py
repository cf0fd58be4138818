"""GPU names as tools report them, reduced to the model names configs use. Pure.

nvidia-smi says `NVIDIA A100-SXM4-80GB`, `Tesla T4`, `NVIDIA GeForce RTX 4090`; amd-smi says
`AMD Instinct MI300X`; hl-smi says `HL-225` (a Gaudi2); a provider's catalogue says `A10G`,
`v5litepod-8`, `Gaudi2`. A config says `A100`, `A100-80GB`, `RTX4090`, `MI300X`. Both sides
are parsed into a model (the canonical spelling of `config.gpu.KNOWN_GPUS`), a memory size
and form-factor words (`SXM4`, `PCIE`), and compared part by part.

Memory is the marketed size: the tools report what the driver can use (an A10G's 24GB shows
as 22.5GiB, an H100's 80GB as 79.6GiB), so a reported size just below a size the model is
sold with counts as that size.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from dstack_plan.config.gpu import KNOWN_GPUS, GPUVendor, gpu_vendor_of

__all__ = [
    "GPUModel",
    "compute_capability",
    "marketed_memory_gb",
    "normalise_gpu_name",
    "parse_wanted_name",
]

# Words that name a brand or product line, not a model: dropped before looking for the model.
_BRAND_WORDS = frozenset(
    "nvidia amd intel habana google cloud tpu tesla geforce quadro instinct radeon graphics "
    "generation accelerator".split()
)
# Words that say how a model is built or attached: kept, so `A100-SXM4` can ask for them.
_FORM_WORDS = frozenset("sxm sxm2 sxm3 sxm4 sxm5 sxm6 pcie oam hbm2 hbm2e hbm3 hbm3e mxm".split())
_ALIASES = {
    # tool spellings and short names -> the table's spelling
    "a4000": "RTXA4000",
    "a5000": "RTXA5000",
    "a6000": "RTXA6000",
    "hl205": "Gaudi",
    "hl225": "Gaudi2",
    "hl225l": "Gaudi2",
    "hl325": "Gaudi3",
    "hl325l": "Gaudi3",
}
_MEMORY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*gb", re.IGNORECASE)
_SPLIT_RE = re.compile(r"[\s\-/_,()]+")
_TPU_RE = re.compile(r"(?:tpu-)?(v\d[a-z0-9-]*)", re.IGNORECASE)

_MARKETED_GB: dict[str, tuple[float, ...]] = {
    "B300": (288,), "B200": (180, 192), "GB200": (186, 192), "GH200": (96, 144),
    "H200": (141,), "H200NVL": (141,), "H100": (80, 94, 96), "H100NVL": (94, 96),
    "H800": (80,), "H20": (96, 141), "A100": (40, 80), "A800": (40, 80), "A40": (48,),
    "A30": (24,), "A10G": (24,), "A10": (24,), "A16": (16,), "A2": (16,), "L40S": (48,),
    "L40": (48,), "L4": (24,), "T4": (16,), "V100": (16, 32), "P100": (12, 16), "P40": (24,),
    "P4": (8,), "K80": (12,), "RTX3090": (24,), "RTX4090": (24,), "RTX5090": (32,),
    "RTX6000": (24,), "RTX6000Ada": (48,), "RTXPRO6000": (96,), "RTXA4000": (16,),
    "RTXA5000": (24,), "RTXA6000": (48,), "MI355X": (288,), "MI350X": (288,),
    "MI325X": (256,), "MI300X": (192,), "MI300A": (128,), "MI250X": (128,), "MI250": (128,),
    "MI210": (64,), "MI100": (32,), "Gaudi": (32,), "Gaudi2": (96,), "Gaudi3": (128,),
}  # fmt: skip
_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("B300",), (10, 3)),
    **dict.fromkeys(("B200", "B100", "GB200"), (10, 0)),
    **dict.fromkeys(("GH200", "H200", "H200NVL", "H100", "H100NVL", "H800", "H20"), (9, 0)),
    **dict.fromkeys(("A100", "A800", "A30"), (8, 0)),
    **dict.fromkeys(
        ("A40", "A10G", "A10", "A16", "A2", "RTX3090", "RTXA4000", "RTXA5000", "RTXA6000"),
        (8, 6),
    ),
    **dict.fromkeys(("L40S", "L40", "L4", "RTX4090", "RTX6000Ada"), (8, 9)),
    **dict.fromkeys(("RTX5090", "RTXPRO6000"), (12, 0)),
    **dict.fromkeys(("T4", "RTX6000"), (7, 5)),
    "V100": (7, 0),
    "P100": (6, 0),
    **dict.fromkeys(("P40", "P4"), (6, 1)),
    "K80": (3, 7),
}
_SHORTFALL = 0.9
"""A reported size down to this share of a marketed size counts as that size."""


class GPUModel(NamedTuple):
    """A GPU name taken apart."""

    model: str | None
    """The table's spelling (`A100`, `RTX4090`, `v5litepod-8`); None for a name it lacks."""
    memory_gb: float | None
    """Memory the name states (`80GB`); None when it states none."""
    forms: frozenset[str]
    """Form-factor words, lower-case (`sxm4`, `pcie`)."""
    raw: str
    """The name as given, without brand words: what is compared when `model` is None."""

    @property
    def vendor(self) -> GPUVendor | None:
        return gpu_vendor_of(self.model) if self.model else None


@lru_cache(maxsize=4096)  # a cluster has few distinct names; the scheduler asks often
def normalise_gpu_name(name: str) -> GPUModel:
    """Take a GPU name apart: `NVIDIA A100-SXM4-80GB` -> A100, 80GB, {sxm4}."""
    tpu = _TPU_RE.fullmatch(name.strip())
    if tpu is not None:
        return GPUModel(tpu[1].lower(), None, frozenset(), tpu[1].lower())
    memory = None
    found = _MEMORY_RE.search(name)
    if found is not None:
        memory = float(found[1])
    words = [w for w in _SPLIT_RE.split(_MEMORY_RE.sub(" ", name)) if w]
    words = [w for w in words if w.lower() not in _BRAND_WORDS]
    forms = frozenset(w.lower() for w in words if w.lower() in _FORM_WORDS)
    rest = [w for w in words if w.lower() not in _FORM_WORDS]
    return GPUModel(_model_in(rest), memory, forms, " ".join(rest))


def parse_wanted_name(name: str) -> GPUModel:
    """A name from a config: `A100`, `A100-80GB`, `A100-SXM4-80GB`, `v5litepod-8`, `Fake`."""
    return normalise_gpu_name(name)


def marketed_memory_gb(model: str | None, memory_mib: int) -> float:
    """The memory a GPU is sold with, from what a tool reports (MiB): 23028 MiB of an A10G is
    24GB. A model the table lacks, or a size far from every marketed one: the GiB reported."""
    reported = memory_mib / 1024
    for size in _MARKETED_GB.get(model or "", ()):
        if size * _SHORTFALL <= reported <= size * 1.02:
            return size
    return round(reported, 1)


def compute_capability(model: str | None) -> tuple[int, int] | None:
    """The CUDA compute capability of an NVIDIA model, when the table knows it."""
    return _COMPUTE_CAPABILITY.get(model or "")


def same_model(wanted: GPUModel, actual: GPUModel) -> bool:
    """Whether a wanted name's model is the actual GPU's: models equal when both are known,
    else the name equal to, or one word of, the actual name (case-insensitive)."""
    if wanted.model is not None and actual.model is not None:
        return wanted.model.lower() == actual.model.lower()
    if wanted.model is not None and wanted.model.lower() in _words(actual.raw):
        return True
    key = wanted.raw.replace(" ", "").lower()
    return key == actual.raw.replace(" ", "").lower() or key in _words(actual.raw)


def _words(text: str) -> set[str]:
    return {w.lower() for w in text.split()}


def _model_in(words: list[str]) -> str | None:
    """The first known model among the words; a model spelt over several words (`RTX 6000
    Ada`, `H100 NVL`) is tried before its first word alone."""
    for start in range(len(words)):
        for end in range(min(len(words), start + 3), start, -1):
            key = "".join(words[start:end]).lower()
            if key in _ALIASES:
                return _ALIASES[key]
            if key in KNOWN_GPUS:
                return KNOWN_GPUS[key][0]
    return None
