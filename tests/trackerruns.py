"""Real tracker run folders for the evidence tests, written by the trackers themselves around a tiny
Qwen3.5 training loop on CPU, so their consoles hold transformers' own fallback lines.

`python tests/trackerruns.py wandb OUT` writes a W&B offline run (wandb, the `test` extra; run by the
tests into a session folder). `python tests/trackerruns.py swanlab OUT` writes a SwanLab local run: swanlab
0.10.3 pins protobuf 6 and draftboard 7, so it runs from a venv of its own that can also import this
venv's torch and transformers; tests/data/swanlog/ is its output, kept as written.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = 5


def train(log) -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM

    from tests.tiny import qwen35_config

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(qwen35_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 24))
    for step in range(STEPS):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        log({"train/loss": out.loss.item(), "train/acc": 0.1 * step}, step * 10)
        print(f"step {step * 10} loss {out.loss.item():.4f}")


def main(kind: str, out: str) -> None:
    config = {"lr": 1e-3, "block_size": 16, "target": "tiny-qwen3.5"}
    if kind == "wandb":
        os.environ["WANDB_MODE"] = "offline"
        import wandb

        run = wandb.init(project="dflash-drafter", dir=out, config=config)
        train(lambda metrics, step: wandb.log(metrics, step=step))
        run.summary["eval/best_tau"] = 3.25  # set on the summary alone, as trainers record a best value
        run.finish()
    else:
        import swanlab

        swanlab.init(project="dflash-drafter", mode="local", logdir=out, config=config)
        train(lambda metrics, step: swanlab.log(metrics, step=step))
        swanlab.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
