"""stage=distill: word alignment, losses (KL only with a shared vocabulary), falling loss, teacher
handling (frozen, out of checkpoints, built when missing, MNTP adaptation)."""
import pytest
import torch

from dociq.data.collate import DocumentCollator
from dociq.models.sizes import complete_model_config
from dociq.models.teacher import build_tiny_teacher
from dociq.models.text_encoder import load_tokenizer
from dociq.training.tasks.distill import RANDOM_TEACHER_MARKER, DistillTask, pool_words, words_from_wordpiece

from test_mlm import WORDS, make_pages, mlm_batch

STUDENT = complete_model_config({"size": "tiny", "text_encoder": {"num_hidden_layers": 1}})


@pytest.fixture(scope="module")
def wordpiece_teacher(tmp_path_factory):
    """Random tiny Llama with the student's vocabulary (what the default config builds)."""
    return build_tiny_teacher(tmp_path_factory.mktemp("wp_teacher"), hidden_size=48, layers=1, heads=2)


@pytest.fixture(scope="module")
def bpe_teacher(tmp_path_factory):
    """Random tiny GPT-2 with its own byte-level BPE vocabulary: tokenises words differently."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                       n_positions=256, bos_token_id=1, eos_token_id=2))
    out = tmp_path_factory.mktemp("bpe_teacher")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def encoder_teacher(tmp_path_factory):
    """A random tiny BERT saved without an LM head, like a sentence encoder (MiniLM): same vocabulary."""
    from transformers import BertConfig, BertModel

    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    # 16 positions: shorter than the test pages (22 tokens), which the teacher must then cut
    model = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=16))
    out = tmp_path_factory.mktemp("encoder_teacher")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def test_pool_words_averages_each_words_tokens():
    features = torch.arange(12.0).view(1, 6, 2)
    word_index = torch.tensor([[-1, 0, 0, 2, 2, -1]])
    pooled, valid = pool_words(features, word_index, 3)
    assert valid.tolist() == [[True, False, True]]
    assert torch.allclose(pooled[0, 0], features[0, 1:3].mean(0))
    assert torch.allclose(pooled[0, 2], features[0, 3:5].mean(0))


def test_words_are_rebuilt_from_wordpiece():
    tokenizer = load_tokenizer()
    batch = DocumentCollator(image_size=128)(make_pages(2))
    words = words_from_wordpiece(batch["ocr_ids"], batch["ocr_word_index"], tokenizer)
    assert words == [page.words for page in make_pages(2)]  # lower-case words survive exactly


def _train(task, batch, steps, lr=3e-3):
    params = [p for _, p in task.trainable_named_parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr)
    history = []
    for _ in range(steps):
        out = task(batch)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        history.append({k: v.item() for k, v in out.items()})
    return history


def test_distill_loss_falls_with_kl_when_vocabularies_match(wordpiece_teacher):
    torch.manual_seed(0)
    task = DistillTask(STUDENT, teacher={"path": str(wordpiece_teacher)})
    assert task.shared_vocab
    batch = mlm_batch(make_pages())
    history = _train(task, batch, steps=10)
    assert {"loss", "mlm_loss", "mlm_acc", "hidden_cos", "hidden_mse", "kl"} <= set(history[0])
    assert history[0]["kl"] > 0
    assert history[-1]["loss"] < history[0]["loss"] - 1.0
    assert history[-1]["hidden_cos"] < history[0]["hidden_cos"]
    # the teacher is frozen, not optimised and not in the checkpoint
    teacher = task.teacher.model
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not any(k.startswith("_teacher") or "teacher" in k for k in task.state_dict())
    trainable = {n.split(".")[0] for n, _ in task.trainable_named_parameters()}
    assert trainable == {"text_encoder", "mlm_head", "projection"}


def test_no_kl_when_vocabularies_differ_and_words_align(bpe_teacher):
    torch.manual_seed(0)
    task = DistillTask(STUDENT, teacher={"path": str(bpe_teacher)})
    assert not task.shared_vocab
    batch = mlm_batch(make_pages())
    ids, mask, word_index = task.teacher_tokens(batch)
    # every OCR word is covered by at least one teacher token, in order
    for row in range(len(ids)):
        seen = word_index[row][word_index[row] >= 0].unique_consecutive().tolist()
        assert seen == list(range(int(batch["ocr_word_index"][row].max()) + 1))
    history = _train(task, batch, steps=8)
    assert "kl" not in history[0]
    assert history[-1]["hidden_cos"] < history[0]["hidden_cos"]
    assert history[-1]["loss"] < history[0]["loss"]


def test_kl_weight_zero_switches_it_off(wordpiece_teacher):
    task = DistillTask(STUDENT, teacher={"path": str(wordpiece_teacher)}, weights={"kl": 0.0})
    assert "kl" not in task(mlm_batch(make_pages(2)))


def test_missing_teacher_is_built_only_when_asked(tmp_path, caplog):
    target = tmp_path / "teachers" / "tiny"
    with pytest.raises(FileNotFoundError, match="make_tiny_teacher.py"):
        DistillTask(STUDENT, teacher={"path": str(target)})
    with caplog.at_level("WARNING"):
        task = DistillTask(STUDENT, teacher={"path": str(target), "build_if_missing": True})
    assert (target / "config.json").exists() and (target / RANDOM_TEACHER_MARKER).exists()
    assert "RANDOM tiny" in caplog.text and "teacher.path" in caplog.text
    assert task.shared_vocab


def test_unknown_teacher_key_is_rejected(wordpiece_teacher):
    with pytest.raises(KeyError, match="pth"):
        DistillTask(STUDENT, teacher={"pth": str(wordpiece_teacher)})


def test_mntp_adaptation_changes_the_teacher(wordpiece_teacher, tmp_path):
    task = DistillTask(STUDENT, teacher={"path": str(wordpiece_teacher),
                                         "mntp": {"steps": 3, "lr": 1e-3, "save_to": str(tmp_path / "mntp")}})
    before = {k: v.clone() for k, v in task.teacher.model.state_dict().items()}
    batches = [mlm_batch(make_pages(2, seed=s), seed=s) for s in range(2)]
    losses = task.adapt_teacher(batches)
    assert len(losses) == 3 and all(l > 0 for l in losses)
    after = task.teacher.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in task.teacher.model.parameters())
    assert (tmp_path / "mntp" / "config.json").exists()


def test_teacher_without_lm_head_needs_kl_and_mntp_off(encoder_teacher):
    with pytest.raises(ValueError, match="no trained LM head.*task.weights.kl=0"):
        DistillTask(STUDENT, teacher={"path": str(encoder_teacher)})
    with pytest.raises(ValueError, match="task.teacher.mntp.steps=0"):
        DistillTask(STUDENT, teacher={"path": str(encoder_teacher), "mntp": {"steps": 2}},
                    weights={"kl": 0.0})


def test_encoder_teacher_distils_hidden_states(encoder_teacher):
    torch.manual_seed(0)
    task = DistillTask(STUDENT, teacher={"path": str(encoder_teacher)}, weights={"kl": 0.0})
    assert task.shared_vocab and not task.teacher.has_lm_head and task.teacher_length() == 16
    history = _train(task, mlm_batch(make_pages()), steps=8)
    assert "kl" not in history[0]
    assert history[-1]["hidden_cos"] < history[0]["hidden_cos"] - 0.05


def test_pages_longer_than_the_teacher_reads_are_cut_for_it(wordpiece_teacher):
    torch.manual_seed(0)
    task = DistillTask(STUDENT, teacher={"path": str(wordpiece_teacher), "max_length": 10})
    batch = mlm_batch(make_pages())
    assert batch["ocr_ids"].shape[1] > 10
    ids, mask, word_index = task.teacher_tokens(batch)
    assert ids.shape[1] == mask.shape[1] == word_index.shape[1] == 10
    out = task(batch)
    assert torch.isfinite(out["loss"]) and out["kl"] > 0
