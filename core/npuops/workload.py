"""Workloads: one concrete problem (shapes, dtype, parameters) for one op.

A workload is plain data. ``params`` holds what its source stated; ``chosen`` holds values npuops
picked where the source was silent (recorded so results stay reproducible); the op's parameter
defaults fill the rest. :meth:`npuops.Op.config` merges the three.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import WorkloadError

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "f32": torch.float32,
    "f64": torch.float64,
    "fp8e4m3": torch.float8_e4m3fn,
    "fp8e5m2": torch.float8_e5m2,
    "i8": torch.int8,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise WorkloadError(f"dtype {name!r} is not known; allowed: {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise WorkloadError(f"torch dtype {dtype} has no npuops name; allowed: {', '.join(DTYPES)}")


def _freeze(value: Any) -> Any:
    """JSON lists become tuples so workloads hash and compare by value."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Workload:
    op: str
    id: str
    label: str
    dtype: str
    shapes: Mapping[str, tuple[int, ...]]
    params: Mapping[str, Any] = field(default_factory=dict)
    chosen: Mapping[str, Any] = field(default_factory=dict)
    shape_dtypes: Mapping[str, str] = field(default_factory=dict)
    source: str = "catalog"

    def __post_init__(self) -> None:
        for key in ("op", "id", "label", "dtype"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise WorkloadError(f"workload field {key!r} must be a non-empty string, got {value!r}")
        where = f"{self.op} {self.id}"
        torch_dtype(self.dtype)
        if not isinstance(self.shapes, Mapping) or not self.shapes:
            raise WorkloadError(f"{where}: field 'shapes' must map tensor names to shapes, got {self.shapes!r}")
        shapes = {}
        for name, shape in self.shapes.items():
            if not isinstance(shape, list | tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise WorkloadError(
                    f"{where}: shape of {name!r} must be a list of non-negative integers, got {shape!r}"
                )
            shapes[name] = tuple(shape)
        for name, dt in self.shape_dtypes.items():
            if name not in shapes:
                raise WorkloadError(f"{where}: 'shape_dtypes' names {name!r}, which is not in 'shapes' ({', '.join(shapes)})")
            torch_dtype(dt)
        for key in ("params", "chosen"):
            if not isinstance(getattr(self, key), Mapping):
                raise WorkloadError(f"{where}: field {key!r} must be a mapping, got {getattr(self, key)!r}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "params", _freeze(dict(self.params)))
        object.__setattr__(self, "chosen", _freeze(dict(self.chosen)))
        object.__setattr__(self, "shape_dtypes", dict(self.shape_dtypes))

    @property
    def key(self) -> str:
        """``Op/W3``: how the CLI and results name a workload."""
        return f"{self.op}/{self.id}"

    def dtype_of(self, tensor: str) -> torch.dtype:
        return torch_dtype(self.shape_dtypes.get(tensor, self.dtype))

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "op": self.op,
            "id": self.id,
            "label": self.label,
            "dtype": self.dtype,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "params": _thaw(self.params),
        }
        if self.chosen:
            record["chosen"] = _thaw(self.chosen)
        if self.shape_dtypes:
            record["shape_dtypes"] = dict(self.shape_dtypes)
        return record

    @property
    def fingerprint(self) -> str:
        """Stable hash of everything that defines the problem (not its source)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], op: str | None = None, source: str = "catalog") -> Workload:
        allowed = {"op", "id", "label", "dtype", "shapes", "params", "chosen", "shape_dtypes"}
        extra = set(record) - allowed
        if extra:
            raise WorkloadError(
                f"workload {record.get('id', '?')}: unknown field(s) {', '.join(sorted(extra))}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        op_name = record.get("op", op)
        missing = [k for k in ("id", "dtype", "shapes") if k not in record] + ([] if op_name else ["op"])
        if missing:
            raise WorkloadError(
                f"workload {record.get('id', '?')}: missing field(s) {', '.join(missing)}"
            )
        return cls(
            op=op_name,
            id=record["id"],
            label=record.get("label", record["id"]),
            dtype=record["dtype"],
            shapes=record["shapes"],
            params=record.get("params", {}),
            chosen=record.get("chosen", {}),
            shape_dtypes=record.get("shape_dtypes", {}),
            source=source,
        )


def load_workload_file(path: str | Path) -> list[Workload]:
    """User workloads from TOML (``[[workload]]`` tables) or JSON (a list, or ``{"workloads": [...]}``)."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"workload file {str(path)!r} does not exist")
    if path.is_dir():
        raise WorkloadError(f"workload file {str(path)!r} is a folder; give a .toml or .json file")
    if path.suffix not in (".toml", ".json"):
        raise WorkloadError(f"workload file {str(path)!r}: use a .toml or .json file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"workload file {str(path)!r} is not UTF-8 text (byte {exc.start}); "
                            f"give a {path.suffix[1:].upper()} text file") from None
    except OSError as exc:
        raise WorkloadError(f"workload file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
            records = data.get("workload", data.get("workloads"))
        elif path.suffix == ".json":
            data = json.loads(text)
            records = data.get("workloads") if isinstance(data, dict) else data
        else:
            raise WorkloadError(f"workload file {str(path)!r}: use a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"workload file {str(path)!r} is not valid {path.suffix[1:].upper()}: {exc}") from None
    except RecursionError:
        raise WorkloadError(f"workload file {str(path)!r} nests too deeply to read; a workload is a flat table "
                            "of op, id, dtype, shapes and params") from None
    if not isinstance(records, list) or not records:
        hint = "[[workload]] tables" if path.suffix == ".toml" else 'a list or {"workloads": [...]}'
        raise WorkloadError(f"workload file {str(path)!r} holds no workloads; expected {hint}")
    workloads = []
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise WorkloadError(f"workload file {str(path)!r}: entry {i} is not a table/object")
        try:
            workloads.append(Workload.from_dict(record, source=str(path)))
        except WorkloadError as exc:
            raise WorkloadError(f"workload file {str(path)!r}, entry {i}: {exc}") from None
        except RecursionError:
            raise WorkloadError(f"workload file {str(path)!r}, entry {i}: a value nests too deeply; "
                                "params are numbers, strings, booleans or short lists of them") from None
    return workloads


def load_catalog(path: str | Path | Any) -> dict[str, list[Workload]]:
    """A plugin's packaged catalog: ``{op_name: [workload records]}`` in JSON.

    ``path`` may be an ``importlib.resources`` traversable, so plugins call
    ``load_catalog(files(__package__) / "workloads.json")``.
    """
    data = json.loads(path.read_text())
    return {
        op: [Workload.from_dict(record, op=op) for record in records] for op, records in data.items()
    }
