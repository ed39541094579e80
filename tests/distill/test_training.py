"""Training smoke tests on stories260K: each objective lowers its loss, resuming is exact, and a
saved draft loads in transformers with the same logits."""

import os

import pytest
import torch

from speclm.distill.data import DataSettings
from speclm.distill.run import DistillOptions, prepare, run_distill
from speclm.distill.trainer import TrainConfig, Trainer, lr_factor, step_generator
from tests.conftest import STORIES_TOKENIZER

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = DataSettings(max_new_tokens=24, chat=False, batch_size=16)


def options(tmp_path, student, **kw):
    train = TrainConfig(**({"steps": 12, "lr": 3e-3, "warmup_steps": 2, "checkpoint_every": 0} | kw.pop("train", {})))
    return DistillOptions(
        student,
        str(tmp_path / student),
        weights="fp32",
        data_dir=str(tmp_path.parent / "data"),
        data=DATA,
        batch_size=2,
        train=train,
        **kw,
    )


def held_out_loss(objective) -> float:
    with torch.no_grad():
        return sum(float(objective.loss(step_generator(12345, i))[0]) for i in range(3)) / 3


@pytest.mark.parametrize(
    "student,kw",
    [
        ("draft", {"num_layers": 2, "token_map_size": 300, "alpha": 0.2}),
        ("draft", {"num_layers": 1, "divergence": "jsd", "on_policy": 0.5, "feature_weight": 0.1}),
        ("medusa", {"medusa_heads": 2}),
        ("eagle", {"unroll": 2, "token_map_size": 300}),
    ],
)
def test_training_lowers_the_loss(stories_llm, tmp_path, student, kw):
    opts = options(tmp_path, student, **kw)
    prepared = prepare(opts, stories_llm)
    before = held_out_loss(prepared.objective)
    result = Trainer(prepared.objective, opts.train, str(tmp_path / "state")).train()
    after = held_out_loss(prepared.objective)
    assert result.steps_done == 12 and after < 0.9 * before, (before, after)


def test_resume_gives_the_same_state_as_an_uninterrupted_run(stories_llm, tmp_path):
    def trained(directory, interrupt):
        opts = options(tmp_path, "eagle", train={"steps": 6, "checkpoint_every": 2})
        trainer = Trainer(prepare(opts, stories_llm).objective, opts.train, str(directory))
        if interrupt:
            trainer.train(stop_at=3)  # checkpoints at step 2 and (on stopping) 3
            trainer = Trainer(prepare(opts, stories_llm).objective, opts.train, str(directory))  # a fresh process
            trainer.train(resume=True)
        else:
            trainer.train()
        return trainer

    straight, resumed = trained(tmp_path / "a", False), trained(tmp_path / "b", True)
    assert resumed.losses == straight.losses and resumed.step == 6
    for (name, a), (_, b) in zip(
        straight.objective.module.state_dict().items(), resumed.objective.module.state_dict().items()
    ):
        assert torch.equal(a, b), name
    assert straight.optimizer.state_dict()["state"][0]["exp_avg"].equal(
        resumed.optimizer.state_dict()["state"][0]["exp_avg"]
    )


def test_lr_schedule():
    cfg = TrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert [lr_factor(s, cfg) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert lr_factor(60, cfg) == pytest.approx(0.55)  # halfway down the cosine: 0.1 + 0.9 / 2
    assert lr_factor(110, cfg) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="--lr"):
        TrainConfig(lr=0)


def test_saved_draft_loads_in_speclm_and_transformers_with_equal_logits(stories_llm, tmp_path):
    from transformers import AutoModelForCausalLM

    from speclm import LLM

    opts = options(tmp_path, "draft", num_layers=2, token_map_size=200, train={"steps": 2})
    summary = run_distill(opts, stories_llm)
    assert summary["steps"] == 2 and os.path.exists(os.path.join(opts.out, "speclm_token_map.json"))
    ids = stories_llm.tokenizer.encode("Once upon a time, there was a little")
    ours = LLM(opts.out, tokenizer=STORIES_TOKENIZER)
    n = len(ids)
    hidden = ours.model(
        torch.tensor(ids),
        torch.arange(n),
        ours.model.new_cache(n),
        __import__("speclm.models.attention", fromlist=["AttentionMetadata"]).AttentionMetadata(0, n),
    )
    theirs = AutoModelForCausalLM.from_pretrained(opts.out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        expected = theirs(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours.model.compute_logits(hidden), expected, atol=1e-4, rtol=1e-4)
    # the distilled draft is a working proposer: speculative greedy still equals plain greedy
    spec = stories_llm.with_spec(f"draft:{opts.out}", num_speculative_tokens=3, adaptive=False)
    from speclm import SamplingParams

    params = SamplingParams(max_tokens=32)
    assert (
        spec.generate("Once upon a time", params)[0].token_ids
        == stories_llm.generate("Once upon a time", params)[0].token_ids
    )


def test_training_forward_matches_inference_and_backprops(stories_llm):
    """The full stories model: the autograd forward equals the inference forward, gradients reach
    every layer, and the checkpoint-shared tensors of a built model are not touched (copies)."""
    from speclm.distill.student import init_draft_model, trainable_draft_parameters, training_hidden_states
    from speclm.models import load_checkpoint
    from speclm.models.attention import AttentionMetadata
    from tests.conftest import STORIES_MODEL

    checkpoint = load_checkpoint(STORIES_MODEL)
    original = {k: v.clone() for k, v in checkpoint.tensors.items()}
    model, layers = init_draft_model(checkpoint, checkpoint.config.num_layers)  # every layer: the full model
    assert layers == list(range(checkpoint.config.num_layers))
    params = trainable_draft_parameters(model)
    tokens = torch.tensor(stories_llm.tokenizer.encode("Once upon a time, there was a"))
    n = tokens.numel()
    hidden = training_hidden_states(model, tokens)
    expected = stories_llm.model(tokens, torch.arange(n), stories_llm.model.new_cache(n), AttentionMetadata(0, n))
    torch.testing.assert_close(hidden, expected)
    hidden.pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    torch.optim.SGD(params, lr=0.1).step()
    assert all(torch.equal(checkpoint.tensors[k], v) for k, v in original.items())


def test_a_draft_with_its_own_head_is_scored_and_trained_through_it(stories_llm, tmp_path):
    """student_space: a separate draft model keeps its own frozen head. Given the target's head it
    scores exactly as the default; given another head its loss differs, and training lowers the loss
    measured through that head."""
    from speclm.distill.objectives import DraftObjective, HeadSpace
    from speclm.models import load_checkpoint
    from tests.conftest import STORIES_MODEL

    opts = options(tmp_path, "draft", num_layers=2, token_map_size=300)
    base = prepare(opts, stories_llm).objective
    tensors = load_checkpoint(STORIES_MODEL).tensors
    full_head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    token_map = base.space.token_map

    def objective(head):
        space = HeadSpace(head, token_map)
        return DraftObjective(base.student, base.data, base.space, batch_size=2, student_space=space)

    same = objective(full_head)
    own = objective(full_head.roll(1, dims=0))  # each token scored by its neighbour's row
    assert held_out_loss(same) == pytest.approx(held_out_loss(base), rel=1e-6)
    before = held_out_loss(own)
    assert abs(before - held_out_loss(base)) > 0.01
    Trainer(own, opts.train, str(tmp_path / "state")).train()
    assert held_out_loss(own) < 0.9 * before
    assert torch.equal(own.student_space.weight, HeadSpace(full_head.roll(1, dims=0), token_map).weight)  # frozen
    with pytest.raises(ValueError, match="same token map"):
        DraftObjective(base.student, base.data, base.space, student_space=HeadSpace(full_head, token_map[:-1]))
