"""The quick start's demo: a real pretrained model (SmolLM2-135M-Instruct, the packaged GGUF) learns, by GRPO, to
search twice on the fictional world; ``--tiny`` runs the same pipeline on a small Qwen2 model made from scratch."""
