"""The example method's own test: a hand-worked case and a naive loop."""

import torch

from my_methods.capped_pg import capped_pg


def test_hand_worked_and_naive_loop():
    # A = [2.0, -0.5], cap 1: capped A = [1.0, -0.5]; lp row 0 = [-1, -2], row 1 = [-3, (masked)]
    # L = -A·lp: row 0 = [1.0, 2.0], row 1 = [-1.5, 0]; both tokens of row 0 capped: 2 of 3 counted
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -9.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([2.0, -0.5], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = capped_pg(logp, adv, mask, cap=1.0)
    torch.testing.assert_close(loss, torch.tensor([[1.0, 2.0], [-1.5, 0.0]], dtype=torch.float64))
    assert abs(float(m["capped_pg/capped_frac"]) - 2 / 3) < 1e-12
    loss.sum().backward()  # dL/dlp = -capped A on counted tokens, 0 on the masked one
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -1.0], [0.5, 0.0]], dtype=torch.float64))
    naive = torch.zeros(2, 2, dtype=torch.float64)
    for i in range(2):
        for t in range(2):
            if mask[i, t]:
                naive[i, t] = -max(-1.0, min(1.0, float(adv[i]))) * float(logp.detach()[i, t])
    torch.testing.assert_close(loss.detach(), naive)
