"""Trainer(lora=...) and QLoRA: adapters through PEFT, checkpoints of what trains, bit-exact resume, merging, a
PeftModel passed in, and the refusals (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import LazyModule, needs
from setup_models import lm_batches, mlp, mlp_data, tiny_llama
from torch import nn

from nbtrainer import Trainer
from nbtrainer._resume._checkpoint_io import CheckpointError

pytestmark = needs("bitsandbytes", "peft")
peft = LazyModule("peft")

LORA = {"r": 4, "alpha": 8, "dropout": 0.05, "target_modules": "all-linear"}


def _stepped(trainer):
    """What the trainer's optimizer steps."""
    return [p for g in trainer.optimizer.param_groups for p in g["params"]]


def qlora(model: nn.Module | None = None, **kw) -> Trainer:
    options = {"lr": 1e-2, "quantize": "nf4", "lora": LORA, "progress": False, "seed": 0}
    return Trainer(model if model is not None else tiny_llama(), None, "adamw", **{**options, **kw})


def adapters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_qlora_trains_only_adapters_over_a_4bit_base() -> None:
    trainer = qlora()
    assert isinstance(trainer.model, peft.PeftModel)
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert {id(p) for p in _stepped(trainer)} == {id(p) for n, p in trainer.model.named_parameters() if p.requires_grad}
    peft_model: Any = trainer.model
    base = peft_model.get_base_model()
    assert type(base.model.layers[0].mlp.down_proj.base_layer).__name__ == "Linear4bit"
    assert not hasattr(base.lm_head, "lora_A")  # all-linear leaves the output head out
    history = trainer.fit(lm_batches(), epochs=3)
    losses = [e["loss"] for e in history.epochs]
    assert losses[-1] < losses[0]


def test_parameter_counts_of_a_4bit_base_are_its_weights_not_its_packed_bytes() -> None:
    from nbtrainer import profile_model

    trainer = qlora()
    peft_model: Any = trainer.model
    trainable, total = peft_model.get_nb_trainable_parameters()  # two 4-bit weights share a byte: peft unpacks
    counts = trainer.param_counts
    assert (counts.trainable, counts.total, counts.frozen) == (trainable, total, total - trainable)
    assert total - trainable == sum(p.numel() for p in tiny_llama().parameters())  # the base as it was built
    prof = profile_model(trainer.model, lm_batches(1)[0], include=("flops",))
    assert (prof.params, prof.trainable_params) == (total, trainable)


def test_checkpoint_holds_adapters_and_resumes_bit_exactly(tmp_path) -> None:
    data = lm_batches()
    straight = qlora()
    straight.fit(data, epochs=2)
    first = qlora()
    first.fit(data, epochs=1)
    path = first.save_checkpoint(str(tmp_path / "a.ckpt"))
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["model"] and all("lora_" in k for k in ckpt["model"])  # no base weights
    assert ckpt["config"]["quantize"] == "nf4" and ckpt["config"]["lora"] is True
    resumed = qlora()
    resumed.fit(data, epochs=2, resume_from=path)
    a, b = adapters(straight), adapters(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_first_trainer_of_a_process_starts_its_adapters_as_a_later_one_does() -> None:
    """The capability probes (precision, bitsandbytes layer, attention backend) run once per process (cached); their
    random draws must not shift the global RNG the adapters are initialized from, or the first Trainer of a process
    starts elsewhere than the next and a resume matches only where an earlier test had probed already."""
    from nbtrainer._setup import _attention, _precision, _quantize

    for probe in (_precision._support, _quantize._probe, _attention._probe):
        probe.cache_clear()  # as in a fresh interpreter
    # seed=None: the init draws from the global RNG (tiny_llama seeds it), which the probes must leave alone
    first = adapters(qlora(attention="math", seed=None))
    later = adapters(qlora(attention="math", seed=None))  # the probes' answers come from their caches now
    assert first.keys() == later.keys() and all(torch.equal(first[k], later[k]) for k in first)


def test_seed_sets_the_adapters_init_and_leaves_the_callers_rng_alone() -> None:
    a = adapters(qlora(seed=3))
    model = tiny_llama(seed=0)
    torch.manual_seed(12345)  # another global RNG state than the first Trainer saw
    rng = torch.get_rng_state()
    b = adapters(qlora(model, seed=3))
    assert torch.equal(rng, torch.get_rng_state()), "building a seeded Trainer moved the caller's RNG"
    assert all(torch.equal(a[k], b[k]) for k in a), "one seed, two Trainers: the adapters must start equal"
    c = adapters(qlora(seed=4))
    assert any(not torch.equal(a[k], c[k]) for k in a if "lora_A" in k), "another seed, other adapters"


def test_save_base_keeps_the_quantized_base_and_resumes(tmp_path) -> None:
    data = lm_batches(n=2)
    first = qlora(save_base=True)
    first.fit(data, epochs=1)
    path = first.save_checkpoint(str(tmp_path / "b.ckpt"))
    ckpt = torch.load(path, weights_only=True)
    assert any(k.endswith("down_proj.base_layer.weight") for k in ckpt["model"])
    assert any(k.endswith("quant_state.bitsandbytes__nf4") for k in ckpt["model"])
    # a base from another seed: the saved (quantized) base replaces it, so the run continues as the first would
    straight = qlora(save_base=True)
    straight.fit(data, epochs=2)
    resumed = qlora(tiny_llama(seed=1), save_base=True)
    resumed.fit(data, epochs=2, resume_from=path)
    a, b = adapters(straight), adapters(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_the_quantized_base_is_refused(tmp_path) -> None:
    first = qlora()
    first.fit(lm_batches(n=1), epochs=1)
    path = first.save_checkpoint(str(tmp_path / "c.ckpt"))
    plain = Trainer(tiny_llama(), None, "adamw", lora=LORA, progress=False)
    with pytest.raises(CheckpointError, match=r"trained with quantize='nf4', this trainer has quantize=None"):
        plain.fit(lm_batches(n=1), epochs=2, resume_from=path)
    full = Trainer(tiny_llama(), None, "adamw", quantize="nf4", trainable=["lm_head"], progress=False)
    with pytest.raises(CheckpointError, match=r"with LoRA adapters and this trainer has none"):
        full.fit(lm_batches(n=1), epochs=2, resume_from=path)


def test_merge_lora_gives_a_plain_model_with_the_same_outputs() -> None:
    trainer = qlora(lora=dict(LORA, dropout=0.0))
    trainer.fit(lm_batches(), epochs=1)
    merged = trainer.merge_lora()
    assert not isinstance(merged, peft.PeftModel)
    assert not {type(m).__module__.split(".")[0] for m in merged.modules()} & {"peft", "bitsandbytes"}
    ids = lm_batches(n=1)[0]["input_ids"]
    trainer.model.eval()
    merged.eval()
    # with grad enabled both run bitsandbytes' dequantize + matmul path (its no-grad CPU kernel rounds differently)
    expected, got = trainer.model(input_ids=ids).logits, merged(input_ids=ids).logits
    assert (expected - got).abs().max() < 1e-4
    assert isinstance(trainer.model, peft.PeftModel)  # the trainer's model is left as it was


def test_lora_on_a_plain_module() -> None:
    model = mlp()
    x, y = mlp_data()
    with pytest.warns(UserWarning, match="the output head 'head' of MLP stays frozen"):
        trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-2, lora={"r": 4}, progress=False, seed=0)
    assert hasattr(model.fc1, "lora_A") and hasattr(model.fc2, "lora_A") and not hasattr(model.head, "lora_A")
    assert type(model.fc1.base_layer) is nn.Linear  # no quantize=: a full-precision base
    history = trainer.fit((x, y), batch_size=32, epochs=3)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


def test_trainable_layers_train_beside_the_adapters() -> None:
    model = mlp()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", lora={"r": 4}, trainable=["head"])
    assert model.head.weight.requires_grad and type(model.head) is nn.Linear
    assert any(p is model.head.weight for p in _stepped(trainer))


def test_a_peft_model_passed_in_keeps_working() -> None:
    model = peft.get_peft_model(mlp(), peft.LoraConfig(r=4, target_modules=["fc1"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    trainer = Trainer(model, nn.CrossEntropyLoss(), optimizer, progress=False, seed=0)
    x, y = mlp_data()
    history = trainer.fit((x, y), batch_size=32, epochs=2)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]
    with pytest.raises(ValueError, match=r"already is a PeftModel"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", lora={"r": 4})


def test_bad_lora_input_is_refused_before_the_model_changes() -> None:
    model = mlp()
    with pytest.raises(ValueError, match=r"target_modules=\['attn'\] matches no module of MLP.*'fc1'"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", lora={"r": 4, "target_modules": ["attn"]})
    with pytest.raises(ValueError, match=r"unknown keys \['rank'\]"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", lora={"rank": 4})
    with pytest.raises(TypeError, match=r"lora= takes a dict"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", lora=4)
    with pytest.raises(ValueError, match=r"save_base=True is for lora="):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", save_base=True)
    assert type(model.fc1) is nn.Linear and not hasattr(model.fc1, "lora_A")
    assert all(p.requires_grad for p in model.parameters())


def test_gradients_after_an_evaluation_pass_are_the_same() -> None:
    """bitsandbytes repacks 4-bit weights for CPU inference in eval mode (AVX512-BF16), into a layout with no
    backward; our layers opt out, so training after validation gets the gradients it got before."""
    trainer = qlora(lora=dict(LORA, dropout=0.0))
    batch = lm_batches(n=1)[0]

    def grads() -> dict[str, torch.Tensor]:
        trainer.model.train()
        trainer.model.zero_grad()
        trainer.model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    before = grads()
    trainer.evaluate([batch])
    after = grads()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_wrapping_a_transformers_model_shows_no_deprecation_warning_it_did_not_cause():
    """PEFT reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model (#38): nbtrainer's
    LoRA leaves that FutureWarning out, and only that one; PEFT alone still raises it (else this test is moot)."""
    import warnings

    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings(record=True) as alone:
        warnings.simplefilter("always")
        get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    assert any("is_gradient_checkpointing" in str(w.message) for w in alone), [str(w.message) for w in alone]
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        Trainer(tiny_llama(), None, "adamw", lr=1e-3, lora={"r": 4}, activation_checkpointing=True, progress=False)
    assert not [str(w.message) for w in ours if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def _tiny_gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _gpt2_data() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "labels": ids}] * 3


def test_gpt2_conv1d_layers_take_all_linear_lora_and_merge_as_peft_does() -> None:
    """GPT-2's layers are transformers' Conv1D (weight stored (in, out)): "all-linear" adapts them as PEFT's own
    "all-linear" does, without PEFT's fan_in_fan_out warning, and merge_lora() equals PEFT's merge_and_unload."""
    import copy
    import warnings

    from peft import LoraConfig, get_peft_model

    peft_own = get_peft_model(_tiny_gpt2(), LoraConfig(r=4, target_modules="all-linear"))
    theirs = {n for n, m in peft_own.named_modules() if hasattr(m, "lora_A")}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # PEFT's "fan_in_fan_out ... Setting to True" would fail here
        trainer = Trainer(_tiny_gpt2(), None, "adamw", lr=1e-2, lora={"r": 4}, seed=0, progress=False, run_store=False)
    ours = {n for n, m in trainer.model.named_modules() if hasattr(m, "lora_A")}
    assert ours == theirs and len(ours) == 8  # c_attn, c_proj, c_fc, mlp.c_proj in each of 2 blocks
    history = trainer.fit(_gpt2_data(), epochs=2)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]
    merged = trainer.merge_lora()
    peft_model: Any = copy.deepcopy(trainer.model)
    reference = peft_model.merge_and_unload()
    ids = _gpt2_data()[0]["input_ids"]
    merged.eval(), reference.eval(), trainer.model.eval()
    with torch.no_grad():
        ours_out, ref_out = merged(input_ids=ids).logits, reference(input_ids=ids).logits
        torch.testing.assert_close(ours_out, ref_out)
        torch.testing.assert_close(ours_out, trainer.model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_gpt2_conv1d_layers_are_quantized_for_qlora() -> None:
    pytest.importorskip("bitsandbytes")
    trainer = Trainer(_tiny_gpt2(), None, "adamw", lr=1e-2, quantize="nf4", lora={"r": 4}, seed=0, progress=False,
                      run_store=False)  # fmt: skip
    peft_model: Any = trainer.model
    base = peft_model.get_base_model()
    attn = base.transformer.h[0].attn.c_attn
    assert type(attn.base_layer).__name__ == "Linear4bit"  # the Conv1D became a 4-bit linear layer
    assert type(base.lm_head).__name__ == "Linear"  # the output head stays
    history = trainer.fit(_gpt2_data(), epochs=2)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]
    merged: Any = trainer.merge_lora()
    assert type(merged.transformer.h[0].attn.c_attn).__name__ == "Linear"
    ids = _gpt2_data()[0]["input_ids"]
    merged.eval(), trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits.float(), rtol=2e-2, atol=2e-2
        )


def _task_model(kind: str) -> Any:
    import transformers

    torch.manual_seed(0)
    small: dict[str, Any] = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    small["intermediate_size"] = 32
    if kind == "roberta-seq":  # a nested head: classifier.dense and classifier.out_proj
        config: Any = transformers.RobertaConfig(**small, num_labels=3, max_position_embeddings=40)
        return transformers.AutoModelForSequenceClassification.from_config(config)
    config = transformers.BertConfig(**small, num_labels=3, max_position_embeddings=32)
    auto = {"bert-seq": "AutoModelForSequenceClassification", "bert-token": "AutoModelForTokenClassification"}[kind]
    return getattr(transformers, auto).from_config(config)


def _task_data(kind: str) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    shape = (8, 8) if kind == "bert-token" else (8,)
    return [{"input_ids": torch.randint(3, 50, (8, 8), generator=g), "labels": torch.randint(0, 3, shape, generator=g)}
            for _ in range(3)]  # fmt: skip


@pytest.mark.parametrize("kind", ["bert-seq", "bert-token", "roberta-seq"])
def test_a_hugging_face_task_head_trains_beside_the_adapters(kind: str) -> None:
    """Once frozen: the randomly initialised classifier stayed random while the adapters trained on top of it. Now
    it trains in full, as with PEFT's task_type="SEQ_CLS" / "TOKEN_CLS"; the planner counts what the Trainer trains."""
    from nbtrainer._options import MemoryOptions
    from nbtrainer._plan._arithmetic import model_structure, row_tensors

    structure = model_structure(_task_model(kind))
    options: dict[str, Any] = {"lr": 1e-2, "lora": {"r": 4}, "seed": 0, "progress": False, "run_store": False}
    if kind == "roberta-seq":
        options["quantize"] = "nf4"  # QLoRA: the nested head stays in full precision, no adapter inside it
    trainer = Trainer(_task_model(kind), None, "adamw", **options)
    head = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad and "lora" not in n}
    assert head and all(".classifier.modules_to_save." in n for n in head), list(head)
    assert not [n for n, _ in trainer.model.named_modules() if ".classifier." in n and n.endswith("lora_A")]
    stepped = {id(p) for p in _stepped(trainer)}
    assert all(id(p) in stepped for n, p in trainer.model.named_parameters() if n in head)
    planned = row_tensors(structure, MemoryOptions(lora={"r": 4}))
    assert sum(n for n, _, _ in planned.trained) == trainer.param_counts.trainable
    trainer.fit(_task_data(kind), epochs=1)
    trained = dict(trainer.model.named_parameters())
    assert all(not torch.equal(trained[n], before) for n, before in head.items())
    if kind == "roberta-seq":
        merged = trainer.merge_lora()
        assert type(merged.classifier).__name__ == "RobertaClassificationHead"  # the trained copy, unwrapped
        ids = _task_data(kind)[0]["input_ids"]
        merged.eval(), trainer.model.eval()
        expected, got = trainer.model(input_ids=ids).logits, merged(input_ids=ids).logits
        assert (expected - got).abs().max() < 1e-4


def test_trainable_still_says_what_trains_beside_the_adapters_of_a_task_model() -> None:
    trainer = Trainer(_task_model("bert-seq"), None, "adamw", lr=1e-2, lora={"r": 4}, trainable=["classifier.*"],
                      progress=False, run_store=False)  # fmt: skip
    assert not [n for n, _ in trainer.model.named_modules() if "modules_to_save" in n]
    assert [n for n, p in trainer.model.named_parameters() if p.requires_grad and "lora" not in n] == [
        "base_model.model.classifier.weight",
        "base_model.model.classifier.bias",
    ]


def test_a_plain_models_head_is_kept_frozen_or_trained_on_request_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        frozen = Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", lora={"r": 4, "modules_to_save": []}, progress=False)
        saved = Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", lora={"r": 4, "modules_to_save": ["head"]},
                        progress=False)  # fmt: skip
    assert not [n for n, p in frozen.model.named_parameters() if p.requires_grad and "lora" not in n]
    assert [n for n, p in saved.model.named_parameters() if p.requires_grad and "lora" not in n] == [
        "base_model.model.head.modules_to_save.default.weight",
        "base_model.model.head.modules_to_save.default.bias",
    ]


def _full_and_adapted(trainer: Trainer) -> tuple[list[str], set[str]]:
    """The parameters trained in full (no adapter's) and the layers holding adapters."""
    full = [n for n, p in trainer.model.named_parameters() if p.requires_grad and "lora_" not in n]
    adapted = {n.removeprefix("base_model.model.") for n, m in trainer.model.named_modules() if hasattr(m, "lora_A")}
    return full, adapted


def test_a_layer_trainable_names_trains_in_full_instead_of_being_adapted() -> None:
    """trainable=['bert.pooler.*'] once trained nothing there: "all-linear" wrapped the pooler's Linear, PEFT renamed
    its weight to ...base_layer.weight, and the layer stayed frozen without a word. A layer whose weight trainable=
    names now trains in full and gets no adapter; the other linear layers keep theirs."""
    trainer = Trainer(_task_model("bert-seq"), None, "adamw", lr=1e-2, lora={"r": 4}, trainable=["bert.pooler.*"],
                      seed=0, progress=False, run_store=False)  # fmt: skip
    full, adapted = _full_and_adapted(trainer)
    assert full == ["base_model.model.bert.pooler.dense.weight", "base_model.model.bert.pooler.dense.bias"]
    assert "bert.pooler.dense" not in adapted and "bert.encoder.layer.0.attention.self.query" in adapted
    stepped = {id(p) for p in _stepped(trainer)}
    params = dict(trainer.model.named_parameters())
    assert all(id(params[n]) in stepped for n in full)
    before = {n: params[n].detach().clone() for n in full}
    trainer.fit(_task_data("bert-seq"), epochs=1)
    assert all(not torch.equal(params[n], before[n]) for n in full)


def test_a_bias_trainable_names_trains_beside_its_layers_adapter() -> None:
    """Only the weight takes a layer out of the adapters: a bias trainable= names trains beside the adapter of its
    layer, under the name PEFT gives it (...base_layer.bias)."""
    trainer = Trainer(_task_model("bert-seq"), None, "adamw", lr=1e-2, lora={"r": 4},
                      trainable=["bert.pooler.dense.bias"], seed=0, progress=False, run_store=False)  # fmt: skip
    full, adapted = _full_and_adapted(trainer)
    assert full == ["base_model.model.bert.pooler.dense.base_layer.bias"] and "bert.pooler.dense" in adapted
    bias = dict(trainer.model.named_parameters())[full[0]]
    before = bias.detach().clone()
    trainer.fit(_task_data("bert-seq"), epochs=1)
    assert not torch.equal(bias, before)


def test_named_targets_leave_out_the_layers_trainable_names() -> None:
    config = peft.LoraConfig(r=4, target_modules=["dense"], exclude_modules=".*attention.output.dense")
    trainer = Trainer(_task_model("bert-seq"), None, "adamw", lr=1e-2, lora=config, trainable=["bert.pooler.*"],
                      progress=False, run_store=False)  # fmt: skip
    full, adapted = _full_and_adapted(trainer)
    # every "dense" but the pooler (trainable=) and the attention output (the user's own exclusion)
    assert adapted == {"bert.encoder.layer.0.intermediate.dense", "bert.encoder.layer.0.output.dense"}
    assert full == ["base_model.model.bert.pooler.dense.weight", "base_model.model.bert.pooler.dense.bias"]


def test_trainable_and_lora_that_leave_nothing_to_adapt_or_overlap_modules_to_save_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'all-linear' matches nothing.*trainable= trains \['fc1', 'fc2'\] in full"):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", lora={"r": 4}, trainable=["fc*"])
    with pytest.raises(ValueError, match=r"target_modules=\['fc1'\] matches no module of MLP \(trainable= trains"):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", lora={"r": 4, "target_modules": ["fc1"]}, trainable=["fc1"])
    model = mlp()
    saved = r"trainable= names \['head.bias', 'head.weight'\], inside lora modules_to_save=\['head'\]"
    with pytest.raises(ValueError, match=saved):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", lora={"r": 4, "modules_to_save": ["head"]}, trainable=["head"])
    assert type(model.fc1) is nn.Linear and all(p.requires_grad for p in model.parameters())


def _bn_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def test_a_lora_checkpoint_keeps_the_frozen_bases_running_statistics(tmp_path) -> None:
    """A frozen BatchNorm still updates its running mean and variance in train mode: a checkpoint of what trains left
    them out, so a resumed run (and its evaluation) started from the fresh model's statistics."""
    x, y = mlp_data(64)

    def trainer() -> Trainer:
        lora = {"r": 2, "modules_to_save": ["3"]}
        return Trainer(_bn_net(), nn.CrossEntropyLoss(), "adamw", lr=1e-2, lora=lora, progress=False, seed=0)

    first = trainer()
    first.fit((x * 3 + 1, y), batch_size=32, epochs=1)
    path = first.save_checkpoint(str(tmp_path / "bn.ckpt"))
    resumed = trainer()
    resumed.load_state_dict(torch.load(path, weights_only=True))
    want, got = first.model.state_dict(), resumed.model.state_dict()
    stats = [k for k in want if "running_" in k or "num_batches_tracked" in k]
    assert stats and all(torch.equal(want[k], got[k]) for k in stats)


def test_a_lora_checkpoint_written_before_buffers_were_kept_still_resumes_and_says_so(tmp_path) -> None:
    """A checkpoint of what trains alone (as written until buffers were kept): its adapters load, the model keeps its
    own running statistics, and a warning says which; refusing it ("different architecture?") lost the run."""
    x, y = mlp_data(64)

    def trainer() -> Trainer:
        return Trainer(_bn_net(), nn.CrossEntropyLoss(), "adamw", lr=1e-2, lora={"r": 2}, progress=False, seed=0)

    first = trainer()
    first.fit((x * 3 + 1, y), batch_size=32, epochs=1)
    state = first.state_dict()
    buffers = {name for name, _ in first.model.named_buffers()}
    state["model"] = {k: v for k, v in state["model"].items() if k not in buffers}  # the old checkpoint's content
    resumed = trainer()
    own = {k: v.clone() for k, v in resumed.model.state_dict().items() if k in buffers}
    with pytest.warns(UserWarning, match="holds no buffers"):
        resumed.load_state_dict(state)
    got = resumed.model.state_dict()
    adapters = [k for k in state["model"] if "lora_" in k]
    assert adapters and all(torch.equal(state["model"][k], got[k]) for k in adapters)
    assert own and all(torch.equal(own[k], got[k]) for k in own)
