import numpy as np

from engine.model.sampling import sample, sampling_probs


def test_greedy_is_argmax():
    assert sample(np.array([0.1, 3.0, 2.9]), 0.0, 0, 1.0, np.random.default_rng(0)) == 1


def test_temperature_one_is_softmax():
    logits = np.array([1.0, 2.0, 3.0])
    e = np.exp(logits - 3.0)
    assert np.allclose(sampling_probs(logits, 1.0), e / e.sum())


def test_top_k_keeps_k_tokens():
    p = sampling_probs(np.array([1.0, 4.0, 3.0, 2.0]), 1.0, top_k=2)
    assert (p > 0).sum() == 2 and p[1] > p[2] > 0 and p[0] == p[3] == 0


def test_top_p_keeps_smallest_set_reaching_p():
    # probabilities 0.5, 0.3, 0.2: p=0.6 keeps the first two (0.5 < 0.6, 0.8 ≥ 0.6)
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    p = sampling_probs(logits, 1.0, top_p=0.6)
    assert np.allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0.0])


def test_low_temperature_sharpens():
    logits = np.array([1.0, 2.0])
    assert sampling_probs(logits, 0.5)[1] > sampling_probs(logits, 1.0)[1] > sampling_probs(logits, 2.0)[1]


def test_sampled_frequencies_match_probabilities():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([0.7, 0.2, 0.1]))
    draws = [sample(logits, 1.0, 0, 1.0, rng) for _ in range(4000)]
    freq = np.bincount(draws, minlength=3) / 4000
    # 4,000 draws: standard error sqrt(0.7·0.3/4000) = 0.007, so 0.03 is > 4 sigma
    assert np.allclose(freq, [0.7, 0.2, 0.1], atol=0.03)
