"""python -m rollout: see rollout/__init__.py and `python -m rollout --help`."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
