"""Ranks load shares of a dataset, then read shuffled batches of all of it."""

import torch  # import torch before MPI starts
from mpi4py import MPI
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from torch.utils.data import TensorDataset

n = 10_000
features = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
my_dataset = TensorDataset(features, torch.arange(n))  # y: the sample's index

trainset = DistDataset(my_dataset, "train", MPI.COMM_WORLD)  # loads a share
sampler = DistributedSampler(trainset)  # rank and size from the store
loader = ThreadDataLoader(
    trainset,
    batch_size=128,
    sampler=sampler,
    num_workers=2,  # reader threads
)
rank, size = trainset.ddstore.rank, trainset.ddstore.size
for epoch in range(2):
    sampler.set_epoch(epoch)
    samples = 0
    for x, y in loader:  # x: 128 samples of any rank's share
        samples += len(y)  # a training step goes here
    print(f"rank {rank} of {size}, epoch {epoch}: {samples} samples read")
trainset.free()
