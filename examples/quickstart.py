"""Each rank loads its share of a dataset, then reads shuffled batches of every rank's samples."""

import torch  # import torch before MPI starts
from mpi4py import MPI
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from torch.utils.data import TensorDataset

n = 10_000
features = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
my_dataset = TensorDataset(features, torch.arange(n))  # (x, y): y is the sample's index

trainset = DistDataset(my_dataset, "train", MPI.COMM_WORLD)  # each rank loads its share
sampler = DistributedSampler(trainset)  # rank and size from the store
loader = ThreadDataLoader(trainset, batch_size=128, sampler=sampler, num_workers=1)
rank, size = trainset.ddstore.rank, trainset.ddstore.size
for epoch in range(2):
    sampler.set_epoch(epoch)
    samples = 0
    for x, y in loader:  # x: 128 samples of any rank; a training step goes here
        samples += len(y)
    print(f"rank {rank} of {size}, epoch {epoch}: {samples} samples read, y {y[:3].tolist()}...")
trainset.free()
