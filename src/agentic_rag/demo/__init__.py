"""The quick start's demo: a tiny model that learns, by GRPO, to search twice on the fictional world."""
