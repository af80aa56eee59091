"""Fine-tune the coherence scorer LLM-AD* of READ (Appendix B.2) on an AD corpus.

The training is :mod:`agentcap.judges.coherence_training`; this script is its command line
(``--help`` gives the whole description).

    python tools/train_coherence_scorer.py --corpus data/toy_movie/corpus.jsonl --tiny \
        --out runs/read-demo/scorer --batch-size 16 --grad-accum 1 --lr 3e-3 --max-steps 300
    python tools/train_coherence_scorer.py --corpus audiovault.jsonl --base /models/gpt2 --out runs/llm_ad
"""

from __future__ import annotations

import sys

from agentcap.judges.coherence_training import main

if __name__ == "__main__":
    sys.exit(main())
