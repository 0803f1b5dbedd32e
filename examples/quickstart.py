"""The quickstart of docs/index.md, as written: `mpirun -n 2 python examples/quickstart.py`.

Each rank loads only its share of the dataset; the sampler takes rank and size from the
store (no torch.distributed group needed under mpirun or srun); every batch is checked
against the source."""

import torch  # import torch before MPI starts
from mpi4py import MPI
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from torch.utils.data import TensorDataset

n = 10_000
features = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
my_dataset = TensorDataset(features, torch.arange(n))  # (x, y): y is the sample's index

trainset = DistDataset(my_dataset, "train", MPI.COMM_WORLD)  # each rank loads only its share
sampler = DistributedSampler(trainset)  # rank and size from the store
loader = ThreadDataLoader(trainset, batch_size=128, sampler=sampler, num_workers=1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    seen = []
    for x, y in loader:
        assert torch.equal(x, features[y])  # any rank's rows, exactly as the source has them
        seen.append(y)
    mine = torch.cat(seen).tolist()
    assert mine == list(sampler)
    everyone = MPI.COMM_WORLD.allgather(mine)
    assert sorted(set(sum(everyone, []))) == list(range(n))  # the ranks together cover every sample
store = trainset.ddstore
print(f"quickstart ok: rank {store.rank} of {store.size} read {len(mine)} samples per epoch")
trainset.free()
