"""Terminal client of the chat server (see ``agentic_rag.serving.client``).

    python service/chat_client.py [--url URL] [--token TOKEN]      # interactive
    python service/chat_client.py --once "question" [--json]        # one-shot, for scripts
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentic_rag.serving.client import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
