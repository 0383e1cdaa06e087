"""Tiny pretrained-model folders built offline (no hub): for the `pretrained` feature's tests.

- `bert(path)`: a 2-layer BERT (hidden size 32) and a WordPiece tokenizer trained with `tokenizers`
  on the words of the built-in text and token data;
- `roberta(path)`: the same with a byte-level BPE tokenizer (RoBERTa/GPT-2 style: pre-split words
  need add_prefix_space=True);
- `gpt2(path)`, `llama(path)`: 2-layer decoder-only models whose tokenizers have no padding
  token (GPT-2's byte-level BPE; a Llama-style one that adds a beginning-of-text token);
- `timm_weights(path)`: timm's `test_resnet` (370k parameters) saved as a safetensors file.

Each is a real `save_pretrained` / `safetensors` file, loaded by the generated code exactly as a
downloaded model would be.
"""

from __future__ import annotations

from pathlib import Path

# The words of the generated projects' built-in data (data.py: TOPICS, FILLER, ENTITIES), so the
# tokenizers split most words into known pieces, some into several.
CORPUS = [
    "goal match team coach season player score league stadium referee",
    "atom theory experiment cell energy planet molecule physics gene data",
    "recipe bread sauce cheese dinner spicy oven garlic soup dessert",
    "flight hotel beach passport journey island museum train luggage tour",
    "the a of and to in it is was on for with as at by this that we they very some",
    "alice bob carol smith dan brown erin frank miller grace hopper heidi",
    "paris berlin new york lima oslo cape town tokyo rome",
    "acme corp globex initech united nations red cross umbrella group",
    "met visited in at from with and said today yesterday joined left for to of near",
]


def bert(path: Path, vocab_size: int = 200, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS * 3, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=160, pad_token_id=tokenizer.pad_token_id,
    )
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def roberta(path: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 3, vocab_size=320, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    Path(path).mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(path))
    tokenizer = RobertaTokenizer(vocab=str(Path(path, "vocab.json")), merges=str(Path(path, "merges.txt")))
    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=162, pad_token_id=tokenizer.pad_token_id,
    )
    RobertaModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def gpt2(path: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 (decoder only) with a byte-level BPE tokenizer that, like GPT-2's, has
    no padding token: the generated code pads with the end-of-text token."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2Model, GPT2Tokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 3, vocab_size=320, special_tokens=["<|endoftext|>"])
    Path(path).mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(path))
    tokenizer = GPT2Tokenizer(vocab=str(Path(path, "vocab.json")), merges=str(Path(path, "merges.txt")))
    assert tokenizer.pad_token is None
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=160,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2Model(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def llama(path: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (decoder only, grouped-query attention) whose tokenizer adds a
    beginning-of-text token and has no padding token."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS * 3, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=160, bos_token_id=bos,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def timm_weights(path: Path, seed: int = 0) -> Path:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = timm.create_model("test_resnet", num_classes=1000)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return Path(path)


# Trained tokenizers break ties between equally frequent pieces in no fixed order, so a test that
# checks exact pieces uses these two, built from a fixed vocabulary: the same pieces every time.
FIXED_WORDPIECE = ["gra", "##ce", "ho", "##pp", "##er", "vis", "##ited", "cape", "town", "yes", "##ter", "##day"]
FIXED_MERGES = ["Ġ v", "i s", "Ġv is", "i t", "e d", "it ed", "Ġ y", "e s"]


def fixed_wordpiece(path: Path, model_from: Path) -> Path:
    """A WordPiece tokenizer with the vocabulary FIXED_WORDPIECE, beside `model_from`'s model."""
    import shutil

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FIXED_WORDPIECE])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    Path(path).mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(model_from, name), Path(path, name))
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(path)
    return Path(path)


def fixed_bpe(path: Path, model_from: Path) -> Path:
    """A RoBERTa byte-level BPE tokenizer: the 256 byte symbols and the merges FIXED_MERGES."""
    import json
    import shutil

    from tokenizers import pre_tokenizers
    from transformers import RobertaTokenizer

    symbols = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    symbols += [m.replace(" ", "") for m in FIXED_MERGES]
    Path(path).mkdir(parents=True)
    Path(path, "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    Path(path, "merges.txt").write_text("#version: 0.2\n" + "\n".join(FIXED_MERGES) + "\n")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(model_from, name), Path(path, name))
    RobertaTokenizer(vocab=str(Path(path, "vocab.json")), merges=str(Path(path, "merges.txt"))).save_pretrained(path)
    return Path(path)
