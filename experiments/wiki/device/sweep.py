"""Screen GRPO recipes of the wiki task on a lent GPU machine: the real model, the wiki quick start's SFT adapter,
every recipe at once (one process each on the one GPU), each validating greedily on the 200 validation questions
every 4 steps (the first recipe at step 0 too: the SFT start's score). Stopped at the deadline; the validation
curves come back as one JSON line, the logs and per-question answers in ``$OUT/sweep.tar.gz``.

    python3 sweep.py DEADLINE_S STEPS   (from the repository root, see README.md)

RECIPES=a,b@1,c+half picks the runs: @N a seed, +X the adapter in /tmp/sft_X (part_sft.py) instead of the SFT's; a
run whose /tmp/sft_X is still being trained (part_sft.py started beside this script) starts once /tmp/sft_X.done
appears. The ``cur`` recipes train on ``$SCREEN_DATA/train_cur.jsonl`` (the training questions the SFT start answers
wrong greedily, made off the device); the ``abs`` recipes (answer branching on the GRPO half of recipes.py's half
split) read ``$SCREEN_DATA/train_split_noyn.jsonl`` / ``train_split_multi.jsonl`` and want ADAPTER to be the split
SFT adapter (prepare.sh QS QS/sft_split puts it in .devdata/sft); the ``o256`` recipes (256-token observations, F1)
want the 256-token SFT adapter (``SFT_DATA=QS/obs256/sft_data.jsonl prepare.sh QS QS/obs256/sft``). SAVE=N
checkpoints every N steps; MEMFRAC=F caps each run at that share of the GPU's memory (several runs share one card);
ADAPTERS_BACK=N returns the latest checkpoint's adapter of the N best non-control runs, in two halves each
(``cat NAME.a NAME.b``).

Search is experiments/wiki/device/sitecustomize.py's bm25s stand-in for Pyserini.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

DATA = os.environ.get("SCREEN_DATA", ".devdata")  # train.jsonl, validation.jsonl, manifest.json, sft/
STEP = re.compile(r"\[grpo\] step (\d+)/")
F1 = "[{name: f1, weight: 1.0}, {name: format, weight: 0.2}]"
RAGAS = (
    "[{name: em, weight: 1.0}, {name: format, weight: 0.2}, {name: ragas, weight: 0.5, params: {metric: id_recall}}]"
)
# 16 questions x 8 rollouts a step (128 completions, 4x the shipped batch), learning rate 1e-4
BIG = {
    "algorithm.learning_rate": "1e-4",
    "algorithm.num_generations": 8,
    "algorithm.per_device_train_batch_size": 8,
    "algorithm.gradient_accumulation_steps": 16,
}
RECIPES = {
    "lr1e4": {"algorithm.learning_rate": "1e-4"},
    "start": {},
    "lr1e4_control": {"algorithm.learning_rate": "1e-4", "algorithm.shuffle_rewards": "true"},
    "lr3e5": {"algorithm.learning_rate": "3e-5"},
    "lr1e4_g8": {
        "algorithm.learning_rate": "1e-4",
        "algorithm.num_generations": 8,
        "algorithm.gradient_accumulation_steps": 16,
    },
    "lr1e4_dyn": {"algorithm.learning_rate": "1e-4", "algorithm.dynamic_sampling": "true"},
    "lr1e4_f1": {"algorithm.learning_rate": "1e-4", "rewards": F1},
    "lr1e4_kl": {"algorithm.learning_rate": "1e-4", "algorithm.beta": 0.05},
    "lr1e4_t05": {"algorithm.learning_rate": "1e-4", "sampling.temperature": 0.5},
    "b16g8": BIG,
    "b16g8_control": {**BIG, "algorithm.shuffle_rewards": "true"},
    "b16g8_t07": {**BIG, "sampling.temperature": 0.7},
    "b16g8_ragas": {**BIG, "rewards": RAGAS},
    "b16g8_f1": {**BIG, "rewards": F1},
    "b16g8_lr2e4": {**BIG, "algorithm.learning_rate": "2e-4"},
    "b16g8_multi": {**BIG, "data.train_file": "MULTI"},  # the multi-hop training questions only
}
# the questions greedy misses, 8 of them x 16 rollouts a step (right answers there are rare draws), groups without
# signal dropped and refilled (DAPO's dynamic sampling)
CUR = {**BIG, "algorithm.num_generations": 16, "algorithm.dynamic_sampling": "true", "data.train_file": "CUR"}
RECIPES |= {
    "cur": CUR,
    "cur_control": {**CUR, "algorithm.shuffle_rewards": "true"},
    "cur_f1": {**CUR, "rewards": F1},
}
# answer branching (a group is one greedy trunk's answers, trained on the answers only) on the GRPO half of the
# half-split (recipes.py split_halves; ADAPTER is then the SFT adapter fitted on the other half), its yes/no
# questions left out (answer branching turned the start's all-"yes" into "no" on CPU): 8 trunks x 16 answers a step
AB = {
    "algorithm.answer_branching": "true",
    "algorithm.learning_rate": "1e-4",
    "algorithm.num_generations": 16,
    "algorithm.per_device_train_batch_size": 16,
    "algorithm.gradient_accumulation_steps": 8,
    "data.train_file": "SPLIT",
}
RECIPES |= {
    "abs": AB,
    "abs_control": {**AB, "algorithm.shuffle_rewards": "true"},
    "abs_lr2e4": {**AB, "algorithm.learning_rate": "2e-4"},
    "abs_multi": {**AB, "data.train_file": "SPLIT_MULTI"},
    "abs_f1": {**AB, "rewards": F1},
}
# 256-token observations (observations.py --tokens 256: room for four of them in the completion) from the 256-token
# SFT start (prepare.sh QS QS/obs256/sft): the CPU runs' F1 recipe (8 questions x 4 rollouts, lr 1e-4), longer, and
# scaled to 16 questions x 8 rollouts
O256 = {"rollout.max_observation_tokens": 256, "rollout.max_completion_tokens": 1232, "rewards": F1,
        "algorithm.learning_rate": "1e-4"}
RECIPES |= {
    "o256_f1": O256,
    "o256_f1_control": {**O256, "algorithm.shuffle_rewards": "true"},
    "o256_f1_lr2e4": {**O256, "algorithm.learning_rate": "2e-4"},
    "o256_b16g8_f1": {**BIG, **O256},
    "o256_b16g8_f1_control": {**BIG, **O256, "algorithm.shuffle_rewards": "true"},
}


def main() -> None:
    deadline = time.time() + float(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    out_dir, runs = Path(os.environ["OUT"]), Path("/tmp/screen_runs")
    runs.mkdir(exist_ok=True)
    index = Path("/tmp/screen_index")
    index.mkdir(exist_ok=True)
    (index / "manifest.json").write_text(Path(DATA, "manifest.json").read_text())  # the config check wants one
    names = os.environ.get("RECIPES", ",".join(RECIPES)).split(",")
    multi = Path("/tmp/train_multi_hop.jsonl")
    multi.write_text("".join(x for x in open(f"{DATA}/train.jsonl") if json.loads(x)["kind"] == "multi_hop"))
    files = {"MULTI": multi, "CUR": Path(DATA, "train_cur.jsonl"), "SPLIT": Path(DATA, "train_split_noyn.jsonl"),
             "SPLIT_MULTI": Path(DATA, "train_split_multi.jsonl")}
    procs, waiting = {}, {}
    for n, name in enumerate(names):
        name_start, _, start = name.partition("+")  # "+X": from the adapter in /tmp/sft_X (part_sft.py)
        recipe, _, seed = name_start.partition("@")
        adapter = f"/tmp/sft_{start}" if start else os.environ.get("ADAPTER", f"{DATA}/sft")
        first = not any(x.partition("+")[2] == start for x in names[:n])
        extra = {k: files.get(v, v) if isinstance(v, str) else v for k, v in RECIPES[recipe].items()}
        sets = {
            "model.name_or_path": "smollm2-135m-instruct",
            "model.tokenizer": "smollm2-135m-instruct",
            "model.adapter": adapter,
            "data.train_file": f"{DATA}/train.jsonl",
            "search.index": index,
            "checkpoint.output_dir": runs / name,
            "checkpoint.save_steps": int(os.environ.get("SAVE", 1000)),
            "seed": int(seed or 0),
            "logging.validation_file": f"{DATA}/validation.jsonl",
            "logging.validation_every": int(os.environ.get("EVERY", 4)),
            "logging.validation_at_start": os.environ.get("AT_START", "true" if first else "false"),
            "logging.swanlab_mode": "disabled",
            "prompt.system_prompt": "Answer the question by searching.",
            "algorithm.max_steps": steps,
            **extra,
        }
        cmd = [
            sys.executable,
            "-m",
            "agentic_rag.training.train",
            "--config",
            "src/agentic_rag/resources/configs/wiki_grpo_smollm2.yaml",
            "--log-level",
            "WARNING",
        ]
        for key, value in sets.items():
            cmd += ["--set", f"{key}={value}"]
        waiting[name] = (Path(f"{adapter}.done") if start else None, cmd)
        (runs / f"{name}.log").write_text("")
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false", JAX_PLATFORMS="cpu",
               PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    if os.environ.get("MEMFRAC"):  # each run's share of the GPU's memory (sitecustomize.py applies it)
        env["AGENTIC_RAG_DEV_MEMFRAC"] = os.environ["MEMFRAC"]
    while time.time() < deadline and (waiting or any(p.poll() is None for p in procs.values())):
        for name, (done, cmd) in list(waiting.items()):
            if done is None or done.exists():
                log = open(runs / f"{name}.log", "w")
                procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
                del waiting[name]
        time.sleep(10)
        at = [f"{name}:{(STEP.findall((runs / f'{name}.log').read_text()) or ['0'])[-1]}" for name in names]
        print(int(time.time()), " ".join(at), flush=True)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    time.sleep(3)
    result = {}
    with tarfile.open(out_dir / "sweep.tar.gz", "w:gz") as tar:
        for name in names:
            vf = runs / name / "validation.jsonl"
            vals = [json.loads(x) for x in vf.read_text().splitlines()] if vf.is_file() else []
            result[name] = {
                "rc": procs[name].returncode if name in procs else "not started",
                "val": {
                    v["step"]: [
                        round(v["eval/em"], 3),
                        round(v.get("eval/em_multi_hop", -1), 3),
                        round(v["eval/searches"], 2),
                    ]
                    for v in vals
                },
            }
            tar.add(runs / f"{name}.log", arcname=f"{name}.log")
            for f in ("validation.jsonl", "validation", "train_summary.json"):
                if (runs / name / f).exists():
                    tar.add(runs / name / f, arcname=f"{name}/{f}")
    adapters_back(out_dir, runs, result, int(os.environ.get("ADAPTERS_BACK", 0)))
    print(json.dumps(result))


def adapters_back(out_dir: Path, runs: Path, result: dict, n: int) -> None:
    """The latest checkpoint's adapter of the ``n`` runs (controls left out) with the best last validation EM, each
    in two halves (one returned file holds at most 16 MiB): ``cat NAME.a NAME.b > adapter_model.safetensors``."""
    def last_em(name: str) -> float:
        val = result[name]["val"]
        return val[max(val)][0] if val else -1.0

    done = [x for x in result if "control" not in x and last_em(x) >= 0]
    for name in sorted(done, key=last_em, reverse=True)[:n]:
        ckpts = sorted((runs / name).glob("checkpoint-*/adapter_model.safetensors"),
                       key=lambda f: int(f.parent.name.split("-")[1]))
        if not ckpts:
            continue
        data, safe = ckpts[-1].read_bytes(), re.sub(r"[^A-Za-z0-9._-]", "_", name)
        half = (len(data) + 1) // 2
        (out_dir / f"{safe}.{ckpts[-1].parent.name}.a").write_bytes(data[:half])
        (out_dir / f"{safe}.{ckpts[-1].parent.name}.b").write_bytes(data[half:])
        result[name]["adapter_back"] = ckpts[-1].parent.name


if __name__ == "__main__":
    main()
