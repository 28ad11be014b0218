"""Models: loading (the embedded SmolLM2-135M-Instruct, local folders, tiny test models),
the one log-prob code path, and the model-side pieces methods add (critics, a shared
prompt prefix, full-vocabulary statistics, a soft prefix).

    loading.py        offline model loading, the embedded model's cache, tiny random Llamas
    logprobs.py       per-token log-probs and entropy, consistent with the sampler
    logprob_rows.py   its row kernel: the kept set, the target log-prob, entropy, chunks
    prefix.py         the shared prompt prefix of the training forward
    vocab.py          full-vocabulary statistics, chunked over positions and vocabulary
    critic.py         the value model of PPO-style methods
    frozen_critic.py  a value head on a frozen base model (RFPO's critic)
    soft_prefix.py    TASCO's trainable soft prefix in front of a frozen model
"""
