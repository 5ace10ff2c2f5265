import torch

# 1 vs 2 threads changes the last bits of a matmul: tests compare at fixed thread count.
torch.set_num_threads(1)
