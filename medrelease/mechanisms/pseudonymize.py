"""``pseudonymize``: keyed deterministic mapping of every value, then min-max normalization.

Seed 004's method. Each value of every released column except the class label is mapped by a
keyed pseudorandom function — AES-128/256 on a fixed-width 16-byte encoding of the value, or
HMAC-SHA256 — to a 64-bit integer, then each column is min-max normalized to [0, 1]. The same
key gives the same output (linkable across releases); another key gives unrelated values.
The key comes from a Prefect Secret block or an environment variable and is never written to
any output. There is NO formal privacy guarantee: equal values stay equal, so uniqueness and
value frequencies survive (a frequency-matching attack re-identifies common values).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from medrelease.data.aggregate import prepare_table
from medrelease.data.config import DatasetConfig
from medrelease.errors import ParameterError
from medrelease.mechanisms.base import (
    Capabilities,
    MechanismBase,
    MechanismParams,
    ReleaseShape,
    RowsOutput,
)
from medrelease.privacy.guarantee import Guarantee, StepDraws

LABEL = "pseudonymization — no formal privacy guarantee"
BLOCK = 16


class PseudonymizeParams(MechanismParams):
    method: Literal["aes", "hmac"] = Field(default="aes", description="keyed mapping")
    normalize: bool = Field(default=True, description="min-max normalize each column to [0, 1]")
    key_source: str = Field(
        default="medrelease-pseudonym-key",
        description="Prefect Secret block name (falls back to env MEDRELEASE_PSEUDONYM_KEY)")


def fixed_width(value: str) -> bytes:
    """16 bytes: length byte + UTF-8 + zero padding; longer values are hashed to 15 bytes first."""
    raw = value.encode("utf-8")
    if len(raw) > BLOCK - 1:
        raw = hashlib.sha256(raw).digest()[: BLOCK - 1]
        return bytes([0xFF]) + raw
    return bytes([len(raw)]) + raw + bytes(BLOCK - 1 - len(raw))


def _aes_codes(values: list[str], key: bytes) -> np.ndarray:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if len(key) not in (16, 24, 32):
        key = hashlib.sha256(key).digest()
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blob = encryptor.update(b"".join(fixed_width(v) for v in values)) + encryptor.finalize()
    blocks = np.frombuffer(blob, dtype=">u8").reshape(-1, 2)[:, 0]
    return blocks.astype(np.float64)


def _hmac_codes(values: list[str], key: bytes) -> np.ndarray:
    return np.array(
        [int.from_bytes(hmac.new(key, v.encode("utf-8"), hashlib.sha256).digest()[:8], "big")
         for v in values], dtype=np.float64)


def pseudonymize_frame(frame: pd.DataFrame, columns: list[str], keep: list[str], key: bytes,
                       method: str = "aes", normalize: bool = True) -> pd.DataFrame:
    """Map each distinct value once per column (fast for repeated values)."""
    if not key:
        raise ParameterError("pseudonymize: the key is empty")
    out: dict[str, Any] = {}
    for column in columns:
        codes, uniques = pd.factorize(frame[column].astype("string"), sort=False)
        texts = [f"{column}\x1f{u}" for u in uniques]  # per-column domain separation
        mapped = _aes_codes(texts, key) if method == "aes" else _hmac_codes(texts, key)
        if normalize and len(mapped):
            low, high = mapped.min(), mapped.max()
            mapped = (mapped - low) / (high - low) if high > low else np.zeros_like(mapped)
        out[column] = mapped[codes]
    for column in keep:
        out[column] = frame[column].to_numpy()
    return pd.DataFrame(out)


class Pseudonymize(MechanismBase):
    name: ClassVar[str] = "pseudonymize"
    capabilities: ClassVar[Capabilities] = Capabilities(
        summary="keyed pseudonyms, no formal guarantee",
        gives="every value replaced by a keyed pseudonym: linkable and re-identifiable by frequency",
        kind="rows",
        output_roles=("dimension", "informative", "class"),
        needs_secret=True,
        audit_designs=(),
        raw_values=False,
    )
    selection: ClassVar[str] = "none"
    Params: ClassVar[type[MechanismParams]] = PseudonymizeParams

    def guarantee(self, params: PseudonymizeParams) -> Guarantee:
        return Guarantee.no_dp_claim(self.name, LABEL,
                                     "equal inputs map to equal outputs; frequencies and uniqueness survive")


    def release_table(self, frame: pd.DataFrame, dimensions: list[str], informative: list[str],
                      class_columns: list[str], params: PseudonymizeParams,
                      rng: np.random.Generator, key: bytes | None = None) -> pd.DataFrame:
        if key is None:
            raise ParameterError(
                "pseudonymize needs a key: create a Prefect Secret block named "
                f"{params.key_source!r} or set MEDRELEASE_PSEUDONYM_KEY")
        table = pseudonymize_frame(frame, dimensions + informative, class_columns, key,
                                   params.method, params.normalize)
        return table.iloc[rng.permutation(len(table))].reset_index(drop=True)

    def release_rows(self, table: pd.DataFrame, config: DatasetConfig,
                     params: PseudonymizeParams, rng: np.random.Generator,
                     draws: StepDraws | None, key: bytes | None) -> RowsOutput:
        """Every row, its values replaced by keyed pseudonyms, in a shuffled order."""
        frame = prepare_table(table, config, include_class=True)
        released = self.release_table(frame, config.dimensions, config.informative,
                                      config.class_columns, params, rng, key)
        return RowsOutput(released, ReleaseShape(rows=len(frame)))

    def row_bounds(self, params: PseudonymizeParams, shape: ReleaseShape) -> tuple[int, int]:
        return shape.rows, shape.rows
