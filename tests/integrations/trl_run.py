"""Short PolicylabGRPOTrainer runs, for the data-parallel test: run it alone or under
`accelerate launch --multi_gpu --num_processes 2` (use_cpu=True: two CPU ranks over gloo).
One run per method in METHODS (comma-separated), one after the other in the same
processes (one interpreter start and torch import for all of them); run METHOD writes its
trained weights to OUT.METHOD.safetensors and each rank the prompts it generated for to
OUT.METHOD.rollout<rank>.

Completions come from a `rollout_func` (TRL's hook) that answers every prompt with the
same fixed token sequences, so a one-process and a two-process run see the same global
batch; generation is the only part of TRL replaced. Everything else (rewards,
advantages over the gathered batch, the loss and its normalizer, the gloo all-reduce,
the optimizer step) is TRL's and policylab's real code."""

from __future__ import annotations

import sys


def main(model_dir: str, out: str, per_device: int, accumulation: int, methods: str) -> None:
    for method in methods.split(","):
        run(model_dir, f"{out}.{method}", per_device, accumulation, method)
    # end the gloo group before the interpreter does: left to interpreter exit, the group's
    # threads are torn down in no fixed order and a rank can abort ("terminate called without
    # an active exception") after its work is done
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run(model_dir: str, out: str, per_device: int, accumulation: int, method: str) -> None:
    """One run of `method`: the trained weights to OUT.safetensors."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from trl import GRPOConfig

    from policylab.integrations.trl import PolicylabGRPOTrainer

    G = 4
    prompts = [f"What is {a} + {a}?" for a in range(1, 5)]  # 4 prompts, one optimizer step
    ds = Dataset.from_list([{"prompt": p} for p in prompts])

    def rollout(batch_prompts, trainer):
        # each rank records the prompts it generated for (a file, not stderr: torchrun's ranks share one pipe)
        with open(f"{out}.rollout{trainer.accelerator.process_index}", "a") as f:
            f.write("\n".join(batch_prompts) + "\n")
        tok = trainer.processing_class
        ids = [tok(p)["input_ids"] for p in batch_prompts]
        comps = []
        for p, i in zip(batch_prompts, range(len(batch_prompts))):
            seed = sum(map(ord, p)) + 7 * (i % G)  # depends on the prompt and its place in the group
            g = torch.Generator().manual_seed(seed)
            n = 3 + seed % 4
            comps.append(torch.randint(10, 2000, (n,), generator=g).tolist())
        return {"prompt_ids": ids, "completion_ids": comps, "logprobs": None}

    def reward(prompts, completions, completion_ids, **kw):
        return [float(len(c) % 3) + 0.1 * (c[0] % 5) for c in completion_ids]

    cfg = GRPOConfig(output_dir=out + ".tmp", use_cpu=True, bf16=False, fp16=False,
                     per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
                     num_generations=G, max_completion_length=8, learning_rate=1e-2, lr_scheduler_type="constant",
                     warmup_steps=0, weight_decay=0.0, max_grad_norm=1e9, max_steps=1, logging_steps=1,
                     report_to="none", save_strategy="no", gradient_checkpointing=False, seed=0, data_seed=0,
                     shuffle_dataset=False, dataloader_num_workers=0, remove_unused_columns=False,
                     disable_tqdm=True, log_completions=False, optim="sgd", use_bias_correction_kl=False)
    trainer = PolicylabGRPOTrainer(method=method, model=model_dir, reward_funcs=[reward], args=cfg,
                                   train_dataset=ds, rollout_func=rollout)
    trainer.train()
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, out + ".safetensors")
    trainer.accelerator.wait_for_everyone()  # the next method's run starts on both ranks together


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
