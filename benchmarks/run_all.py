"""Run every benchmark in this folder (`make bench`), each in its own process, printing its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n## {script.stem}\n", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
