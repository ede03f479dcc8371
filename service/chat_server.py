"""The OpenAI-compatible chat server of the search agent: ``agentic-rag serve`` (see ``agentic_rag.serving.server``).

    python service/chat_server.py --model DIR [--adapter DIR] --index DIR_OR_URL [...]
    bash script/run_server.sh        # the same, with .env loaded first
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentic_rag.serving.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="chat_server"))
