# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fine-tuning what does not fit: QLoRA in the panel
#
# **Usage:** run all cells (*Run → Run All Cells*, or `jupyter execute 06_qlora.ipynb` in a terminal); about a
# minute on 2 CPU cores, no GPU, no download. Needs the project with its quantization extra
# (`pip install -e ".[quant]"`: bitsandbytes, peft, torchao). A small Llama-style decoder, built from a config,
# learns the Zen of Python character by character with a frozen 4-bit (nf4) base and LoRA adapters, in the
# training panel; then one table sets its memory beside full fine-tuning's, and the adapters are merged into a
# plain model.

# %%
import codecs
import contextlib
import io

import torch
from torch.utils.data import DataLoader

from nbtrainer import quiet_imports

# transformers imports torchao when it is installed; on a CPU build torchao logs a line per CUDA library it
# cannot load. quiet_imports drops exactly those known lines while the import runs (nothing else).
with quiet_imports():
    from transformers import LlamaConfig, LlamaForCausalLM

# Models this small run fastest on one intra-op thread, and it leaves a core for the kernel and the panel.
torch.set_num_threads(1)

with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen; we want its text
    import this
text = codecs.decode(this.s, "rot13")
ids = torch.tensor([ord(c) for c in text])  # characters as token ids (ASCII: vocabulary 128)
seq = 32
windows = torch.stack([ids[i : i + seq] for i in range(0, len(ids) - seq, 6)])
samples = [{"input_ids": w, "labels": w} for w in windows]  # a list is a map-style dataset
train_loader: DataLoader[dict[str, torch.Tensor]] = DataLoader(
    samples,  # type: ignore[arg-type]
    batch_size=16,
    shuffle=True,
    generator=torch.Generator().manual_seed(0),
)


def make_model() -> LlamaForCausalLM:
    """A random-init decoder from a config: a stand-in for the pretrained checkpoint you would load."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=seq,
    )
    return LlamaForCausalLM(config)


print(f"{len(text)} characters, {len(windows)} windows of {seq}")

# %% [markdown]
# ## QLoRA in the panel
#
# `quantize="nf4"` turns every linear layer but the output head into a frozen bitsandbytes 4-bit layer;
# `lora={"r": 8, ...}` (or a `peft.LoraConfig`) adds trainable low-rank adapters beside them, through PEFT. Only
# the adapters train, so gradients and optimizer state exist for them alone. The optimizer is given by name: it
# is built over the adapters once they exist.

# %%
from nbtrainer import TrainerWidget

w = TrainerWidget(
    make_model(),
    None,  # a Hugging Face causal LM returns its own loss
    "adamw",
    train_loader,
    lr=3e-3,
    quantize="nf4",
    lora={"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"},
    epochs=4,
    seed=0,
)
w

# %%
history = w.fit()
print(w.trainer.param_counts)
history.to_pandas()[["loss"]].round(3)

# %% [markdown]
# ## Memory: full fine-tuning, QLoRA, an 8-bit optimizer, everything at once
#
# `compare_strategies` trains each strategy from the same weights and data, and measures the peak of live tensor
# memory over one step, split into parameters, gradients, optimizer state and activations. `qlora` shrinks the
# parameters (4-bit weights) and the optimizer state (adapters only); `adamw8bit` keeps AdamW's two moments in one
# byte each; `all` adds bf16 autocast, activation checkpointing and offloaded activations. On a model this small
# the activations outweigh the weights, and QLoRA adds some of its own (the adapters' dropout keeps a copy of each
# adapted layer's input; the 4-bit weights are dequantized for each matmul), so its peak need not drop: its saving
# is in the parameters and the optimizer state, which are what grows with a model's size (bench/RESULTS.md
# measures a larger decoder). The step time is the price: dequantizing costs more than it saves at this size.

# %%
from nbtrainer import compare_strategies

table = compare_strategies(
    make_model,
    None,
    None,
    train_loader,
    strategies=["fp32", "qlora", "adamw8bit", "all"],
    steps=3,
    warmup=1,
    metric=None,
    trainer_kwargs={"lr": 3e-3},
)
print(table)

# %% [markdown]
# ## A plain model for inference
#
# `merge_lora()` adds each adapter into its layer's weight, with the 4-bit base dequantized first, and returns a
# model with neither PEFT nor bitsandbytes in it (the trainer's own model is left as it was).

# %%
merged = w.trainer.merge_lora().eval()
prompt = torch.tensor([[ord(c) for c in "Beautiful is "]])
with torch.no_grad():
    # within the model's context: the prompt and what it generates fit max_position_embeddings (seq)
    out = merged.generate(prompt, max_new_tokens=seq - prompt.shape[1], do_sample=False)
print(repr("".join(chr(int(t)) for t in out[0])))
