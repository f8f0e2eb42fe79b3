"""The LLM teacher: bidirectional attention (LLM2Vec step 1), MNTP (step 2), word alignment."""
import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dociq.data.masking import MLMMasking
from dociq.models.teacher import (
    Teacher,
    adapt_with_mntp,
    build_tiny_teacher,
    is_bidirectional,
    make_bidirectional,
    mntp_loss,
)


def _llama(vocab=64):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64)).eval()


def _gpt2(vocab=64):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      bos_token_id=0, eos_token_id=0)).eval()


def _first_position(model, ids, mask):
    return model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_bidirectional_sees_later_tokens_and_causal_does_not(build):
    ids = torch.tensor([[5, 9, 13, 17, 21, 25]])
    later = ids.clone()
    later[0, 4] = 40
    mask = torch.ones_like(ids)

    causal = build()
    assert torch.allclose(_first_position(causal, ids, mask), _first_position(causal, later, mask))
    assert not is_bidirectional(causal)

    bidirectional = make_bidirectional(build())
    assert not torch.allclose(_first_position(bidirectional, ids, mask),
                              _first_position(bidirectional, later, mask))
    assert is_bidirectional(bidirectional)
    # the padding mask is kept: a padded token changes nothing
    padded = mask.clone()
    padded[0, 4:] = 0
    assert torch.allclose(_first_position(bidirectional, ids, padded),
                          _first_position(bidirectional, later, padded), atol=1e-6)
    # with and without padding in the batch (the SDPA path skips the mask when there is none)
    two = torch.cat([ids, later])
    two_mask = torch.stack([mask[0], padded[0]])
    out = bidirectional.base_model(input_ids=two, attention_mask=two_mask).last_hidden_state
    assert not torch.allclose(out[0, 0], _first_position(bidirectional, ids, padded)[0], atol=1e-5)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return build_tiny_teacher(tmp_path_factory.mktemp("teacher"), hidden_size=32, layers=1, heads=2)


def test_teacher_loads_bidirectional_from_a_local_directory(teacher_dir):
    teacher = Teacher.from_pretrained(teacher_dir)
    assert teacher.bidirectional and is_bidirectional(teacher.model)
    assert (teacher.hidden_size, teacher.vocab_size, teacher.mask_token_id) == (32, 30522, 103)
    assert teacher.has_lm_head and teacher.untrained_head == ()
    causal = Teacher.from_pretrained(teacher_dir, bidirectional=False)
    assert not causal.bidirectional and not is_bidirectional(causal.model)


def test_missing_teacher_directory_names_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="teacher.path"):
        Teacher.from_pretrained(tmp_path / "nope")


def test_tokenize_words_maps_every_token_to_its_word(teacher_dir):
    teacher = Teacher.from_pretrained(teacher_dir)
    ids, mask, word_index = teacher.tokenize_words([["invoice#12", "total:", "9.50"], ["a"]], 32)
    tokens = teacher.tokenizer.convert_ids_to_tokens(ids[0][mask[0]].tolist())
    words = word_index[0][mask[0]].tolist()
    assert tokens[0] == "[CLS]" and words[0] == -1 and words[-1] == -1
    rebuilt = {}
    for token, w in zip(tokens[1:-1], words[1:-1]):
        rebuilt[w] = rebuilt.get(w, "") + token.removeprefix("##")
    assert rebuilt == {0: "invoice#12", 1: "total:", 2: "9.50"}
    assert mask[1].sum() == 3 and word_index[1, 1] == 0


def test_mntp_predicts_token_i_from_position_i_minus_1(teacher_dir):
    teacher = Teacher.from_pretrained(teacher_dir)
    ids = torch.tensor([[101, 2000, 2001, 2002, 2003, 102]])
    labels = torch.full_like(ids, -100)
    labels[0, 3] = 2002
    masked = ids.clone()
    masked[0, 3] = 103
    mask = torch.ones_like(ids, dtype=torch.bool)
    logits = teacher.model(input_ids=masked, attention_mask=mask.long()).logits
    expected = F.cross_entropy(logits[0, 2:3], labels[0, 3:4])
    assert torch.allclose(mntp_loss(teacher, masked, mask, labels), expected, atol=1e-5)


def test_mntp_adaptation_lowers_its_loss():
    from dociq.models.text_encoder import load_tokenizer

    teacher = Teacher(make_bidirectional(_llama(vocab=128)), load_tokenizer())  # [MASK]=103 < 128
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (4, 12), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, [0, -1]] = True
    batch = (ids, torch.ones_like(special), special)
    masking = MLMMasking(teacher.mask_token_id, teacher.vocab_size, prob=0.3)
    losses = adapt_with_mntp(teacher, [batch], masking, steps=20, lr=1e-2,
                             generator=torch.Generator().manual_seed(1))
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    assert not any(p.requires_grad for p in teacher.model.parameters())  # frozen again
    assert is_bidirectional(teacher.model)
