import torch

from longboat.models.generative.keyed_random import _mix, keyed_normal, keyed_randint, keyed_uniform, noise_key

_M = (1 << 64) - 1


def _mix_reference(x: int) -> int:
    """SplitMix64's finaliser on Python integers, the definition the tensor version must equal bit for bit."""
    x &= _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def test_tensor_hash_equals_the_unsigned_definition():
    xs = [0, 1, -1, 123456789, -(1 << 63), (1 << 63) - 1]
    assert [v & _M for v in _mix(torch.tensor(xs, dtype=torch.int64)).tolist()] == [_mix_reference(v) for v in xs]


def test_draws_depend_on_the_key_only():
    keys = torch.tensor([noise_key(7, i) for i in range(4096)])
    u = keyed_uniform(keys, (8,))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    n = keyed_normal(keys, (16,))
    assert abs(n.mean().item()) < 0.02 and abs(n.std().item() - 1) < 0.02
    assert torch.equal(keyed_normal(keys[5:7], (16,)), n[5:7])  # a sample's draw ignores its batch mates
    assert not torch.equal(keyed_normal(keys, (16,), stream=1), n)  # streams are independent draws
    assert noise_key(7, 3) != noise_key(8, 3) and noise_key(7, 3) != noise_key(7, 4)
    # Each distribution and stream draws its own numbers: no stream of one repeats another's.
    draws = [keyed_uniform(keys, (16,), s) for s in range(3)] + [keyed_normal(keys, (16,), s) for s in range(3)]
    draws += [keyed_randint(keys, (16,), 1 << 20, s).float() for s in range(3)]
    for i in range(len(draws)):
        for j in range(i):
            assert abs(torch.corrcoef(torch.stack([draws[i].flatten(), draws[j].flatten()]))[0, 1]) < 0.05
    t = keyed_randint(keys, (1,), 100)
    assert t.min() == 0 and t.max() == 99


def test_noise_key_is_the_tensor_hash_of_seed_and_position():
    from longboat.models.generative.keyed_random import _signed

    for seed, position in [(0, 0), (7, 3), (-5, 2**40), (2**62, 12345), (1234, 10**9)]:
        x = torch.tensor([_signed(seed * 0x9E3779B97F4A7C15 + position)], dtype=torch.int64)
        assert noise_key(seed, position) == int(_mix(_mix(x))[0])
