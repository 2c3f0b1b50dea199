import numpy as np
import pytest

from thinkserve_backend.batching import equal_shape_groups, pad_and_concatenate, split_rows


def test_ragged_requests_are_right_padded_and_split_back():
    a = np.array([[1, 2, 3]])
    b = np.array([[4], [5]])
    batch = pad_and_concatenate([a, b], pad_value=0)
    assert batch.tolist() == [[1, 2, 3], [4, 0, 0], [5, 0, 0]]
    first, second = split_rows(batch, [1, 2])
    assert first.tolist() == [[1, 2, 3]] and second.shape == (2, 3)


def test_equal_shapes_are_not_copied_into_padding():
    a = np.ones((2, 3, 4), dtype=np.float32)
    assert pad_and_concatenate([a, a]).shape == (4, 3, 4)


def test_requests_of_one_shape_are_grouped_in_order():
    shapes = [(3, 48, 64), (3, 48, 128), (3, 48, 64), (3, 48, 320), (3, 48, 128)]
    assert equal_shape_groups(shapes) == [[0, 2], [1, 4], [3]]
    assert equal_shape_groups([]) == []


def test_mismatched_ranks_and_row_counts_are_errors():
    with pytest.raises(ValueError, match="ranks"):
        pad_and_concatenate([np.zeros((1, 2)), np.zeros((1, 2, 3))])
    with pytest.raises(ValueError, match="cannot be split"):
        split_rows(np.zeros((3, 2)), [1, 1])


def test_the_torch_batch_pads_like_the_numpy_one():
    import torch

    from thinkserve_backend import torch_batching

    arrays = [np.array([[1, 2, 3]]), np.array([[4], [5]]), np.array([[6, 7, 8, 9]])]
    expected = pad_and_concatenate(arrays, pad_value=-1)
    batch = torch_batching.pad_and_concatenate([torch.from_numpy(a) for a in arrays], pad_value=-1)
    assert batch.dtype == torch.int64 and batch.numpy().tolist() == expected.tolist()
    pixels = [torch.rand(2, 3, 4, 4), torch.rand(1, 3, 4, 4)]
    assert torch.equal(torch_batching.pad_and_concatenate(pixels), torch.cat(pixels))
    with pytest.raises(ValueError, match="ranks"):
        torch_batching.pad_and_concatenate([torch.zeros(1, 2), torch.zeros(1, 2, 3)])


def test_a_batch_is_joined_on_the_device_as_the_host_join_would_make_it():
    """torch_batching.batch_on_device (what the torch runner feeds its network): one request's tensor as it is,
    equal shapes concatenated, ragged ones padded, every case equal to pad_and_concatenate's batch."""
    import torch

    from thinkserve_backend import torch_batching

    cpu = torch.device("cpu")
    one = [torch.randint(0, 255, (3, 3, 8, 8), dtype=torch.uint8)]
    assert torch_batching.batch_on_device(one, 0, cpu) is one[0]  # nothing copied on the CPU
    equal = one + [torch.randint(0, 255, (2, 3, 8, 8), dtype=torch.uint8)]
    ragged = [torch.tensor([[1, 2, 3]]), torch.tensor([[4], [5]]), torch.tensor([[6, 7, 8, 9]])]
    for tensors, pad in ((equal, 0), (ragged, -1)):
        batch = torch_batching.batch_on_device(tensors, pad, cpu)
        assert batch.dtype == tensors[0].dtype and torch.equal(batch, torch_batching.pad_and_concatenate(tensors, pad))
