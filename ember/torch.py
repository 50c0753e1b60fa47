"""`ember.torch`: capture PyTorch modules as graph IR.

    graph = ember.torch.export(module, (x,))                 # torch.export to ATen
    fast = torch.compile(module, backend="ember")            # the torch.compile backend
"""

from ember.api.torch_dynamo import counters, ember_backend
from ember.frontends.torch.export import export

__all__ = ["counters", "ember_backend", "export"]
