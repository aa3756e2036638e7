"""A reference BertForSequenceClassification in PyTorch, written as Hugging Face's modeling_bert.py computes it
(post-LayerNorm encoder, eps 1e-12, GELU (erf), the extended attention mask (1 - mask) * finfo.min added to the
scores, dropout on embeddings, attention probabilities and hidden states, pooler dense + tanh on [CLS], padding_idx
0) with its module names, so state_dicts move by name. Imported by test_bert_torch.py and bench/bert_vs_torch.py.
The input is dtrain's (B, 3, L): token ids, token type ids, attention mask."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-12
MAX_POSITIONS = 512


def make(vocab, hidden, heads, intermediate, layers, outputs, dropout=0.1):
    H, A, P = hidden, heads, dropout

    class Embeddings(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, H, padding_idx=0)
            self.position_embeddings = nn.Embedding(MAX_POSITIONS, H)
            self.token_type_embeddings = nn.Embedding(2, H)
            self.LayerNorm = nn.LayerNorm(H, eps=EPS)
            self.dropout = nn.Dropout(P)

        def forward(self, ids, types):
            pos = torch.arange(ids.shape[1]).unsqueeze(0)
            e = self.word_embeddings(ids) + self.token_type_embeddings(types) + self.position_embeddings(pos)
            return self.dropout(self.LayerNorm(e))

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
            self.dropout = nn.Dropout(P)

        def heads(self, x):
            return x.view(x.shape[0], x.shape[1], A, H // A).permute(0, 2, 1, 3)

        def forward(self, x, ext_mask):
            q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(H // A) + ext_mask
            ctx = self.dropout(F.softmax(scores, dim=-1)) @ v
            return ctx.permute(0, 2, 1, 3).reshape(x.shape)

    class DenseNorm(nn.Module):
        """BertSelfOutput / BertOutput: LayerNorm(dropout(dense(x)) + residual)."""

        def __init__(self, n_in):
            super().__init__()
            self.dense = nn.Linear(n_in, H)
            self.LayerNorm = nn.LayerNorm(H, eps=EPS)
            self.dropout = nn.Dropout(P)

        def forward(self, x, residual):
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.self = SelfAttention()
            self.output = DenseNorm(H)

    class Intermediate(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(H, intermediate)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.intermediate = Intermediate()
            self.output = DenseNorm(intermediate)

        def forward(self, x, ext_mask):
            a = self.attention.output(self.attention.self(x, ext_mask), x)
            return self.output(F.gelu(self.intermediate.dense(a)), a)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList([Layer() for _ in range(layers)])

    class Pooler(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(H, H)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings, self.encoder, self.pooler = Embeddings(), Encoder(), Pooler()

    class BertForSequenceClassification(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = Bert()
            self.dropout = nn.Dropout(P)
            self.classifier = nn.Linear(H, outputs)

        def forward(self, x):
            ids, types, mask = x[:, 0].long(), x[:, 1].long(), x[:, 2]
            ext = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
            h = self.bert.embeddings(ids, types)
            for layer in self.bert.encoder.layer:
                h = layer(h, ext)
            pooled = torch.tanh(self.bert.pooler.dense(h[:, 0]))
            return self.classifier(self.dropout(pooled))

    return BertForSequenceClassification()


def init_like_hf(m, std=0.02):
    """Hugging Face's _init_weights: Linear and Embedding N(0, std), biases 0, LayerNorm 1/0, padding row 0."""
    for mod in m.modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            mod.weight.data.normal_(0.0, std)
        if isinstance(mod, nn.Linear) and mod.bias is not None:
            mod.bias.data.zero_()
        if isinstance(mod, nn.Embedding) and mod.padding_idx is not None:
            mod.weight.data[mod.padding_idx].zero_()
        if isinstance(mod, nn.LayerNorm):
            mod.weight.data.fill_(1.0)
            mod.bias.data.zero_()
    return m
