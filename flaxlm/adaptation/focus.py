"""FOCUS (Dobler and de Melo, 2023): a new token that the old vocabulary lacks gets a sparse convex combination of
the shared tokens' old embeddings, weighted by how close the tokens are in auxiliary embeddings trained on text of
the new language (gensim's Word2Vec over the new tokenizer's token sequences)."""
import numpy as np

from flaxlm.errors import UserError


def sparsemax(z_BN):
    """The Euclidean projection of each row of scores z_BN (or of one vector) onto the probability simplex
    (Martins and Astudillo, 2016): non-negative weights summing to 1, most of them exactly 0."""
    z_BN = np.asarray(z_BN, np.float64)
    sorted_BN = -np.sort(-z_BN, axis=-1)
    cumsum_BN = np.cumsum(sorted_BN, axis=-1)
    k_N = np.arange(1, z_BN.shape[-1] + 1)
    support_B = np.sum(1 + k_N * sorted_BN > cumsum_BN, axis=-1, keepdims=True)  # the condition holds for a prefix
    tau_B = (np.take_along_axis(cumsum_BN, support_B - 1, axis=-1) - 1) / support_B
    return np.maximum(z_BN - tau_B, 0.0)


def train_aux_embeddings(path, tokenizer, dim=64, epochs=5, seed=0):
    """{token id: unit vector} from Word2Vec (skip-gram) over `path` (one text per line) in the tokenizer's
    tokens; tokens that never occur in the text have no vector."""
    from gensim.models import Word2Vec
    try:
        with open(path, encoding="utf-8") as f:
            sentences = [[str(i) for i in tokenizer(line.strip(), add_special_tokens=False, verbose=False)["input_ids"]]
                         for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read --focus_train_file {path} ({e}); pass a UTF-8 text file") from None
    if not sentences:
        raise UserError(f"--focus_train_file {path} holds no text")
    w2v = Word2Vec(sentences, vector_size=dim, window=5, min_count=1, sg=1, epochs=epochs, seed=seed, workers=1)
    vectors = {int(t): w2v.wv[t] for t in w2v.wv.index_to_key}
    return {t: v / max(np.linalg.norm(v), 1e-12) for t, v in vectors.items()}


def focus_weights(target_BD, shared_SD, temperature=0.1):
    """The sparsemax weights [B, S] over the shared tokens of B new tokens: each one's cosine similarity to each
    shared token (unit vectors in), divided by the temperature (FOCUS's 0.1)."""
    return sparsemax(target_BD @ shared_SD.T / temperature)
