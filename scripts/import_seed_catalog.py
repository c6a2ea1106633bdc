"""One-time import: split the seed catalog (shared/catalog/seed-workloads.json) into the four
family plugins' packaged ``workloads.json``. Keeps each workload exactly as the seed states it
(id, label, dtype, shapes, params, shape_dtypes) and preserves ``chosen`` values already recorded
in the plugin files. Never run at run time; the plugins ship their data.

    python scripts/import_seed_catalog.py ../shared/catalog/seed-workloads.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(seed_path: str) -> None:
    seed = json.loads(Path(seed_path).read_text())
    by_family: dict[str, dict[str, list]] = {}
    for op in seed["ops"]:
        records = []
        for w in op["workloads"]:
            record = {k: w[k] for k in ("id", "label", "dtype", "shapes", "params")}
            if w.get("shape_dtypes"):
                record["shape_dtypes"] = w["shape_dtypes"]
            records.append(record)
        by_family.setdefault(op["family"], {})[op["name"]] = records
    for family, ops in by_family.items():
        path = ROOT / "plugins" / family / f"npuops_{family}" / "workloads.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        for name, records in ops.items():
            chosen = {r["id"]: r["chosen"] for r in old.get(name, []) if "chosen" in r}
            for r in records:
                if r["id"] in chosen:
                    r["chosen"] = chosen[r["id"]]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_format(dict(sorted(ops.items()))))
        print(f"{path.relative_to(ROOT)}: {len(ops)} ops, {sum(map(len, ops.values()))} workloads")


def _format(ops: dict) -> str:
    """One workload per line, so a diff shows which workload changed."""
    blocks = []
    for name, records in ops.items():
        lines = ",\n".join("  " + json.dumps(r) for r in records)
        blocks.append(f" {json.dumps(name)}: [\n{lines}\n ]")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


if __name__ == "__main__":
    main(sys.argv[1])
