"""The rewards' weights fingerprint and eval mode (torchmover._internal.moduletree)."""
import torch
from torch import nn

from torchmover._internal.moduletree import eval_mode, first_parameter, submodules, weights_fingerprint


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)), nn.BatchNorm1d(2))


def test_fingerprint_sees_every_kind_of_weight_change():
    model = make()
    seen = {weights_fingerprint(submodules(model))}

    def changed():
        fp = weights_fingerprint(submodules(model))
        assert fp not in seen
        seen.add(fp)

    assert weights_fingerprint(submodules(model)) in seen  # unchanged: equal
    with torch.no_grad():
        model[0].weight.add_(1.0)  # in place (an optimiser step)
    changed()
    model[1][1].weight = nn.Parameter(torch.zeros(2, 4))  # a parameter replaced
    changed()
    model[1][1] = nn.Linear(4, 2)  # a submodule replaced
    changed()
    model[2].running_mean = torch.ones(2)  # a buffer replaced
    changed()
    model.to(torch.float64)  # cast
    changed()
    model.load_state_dict({k: v + 1 for k, v in model.state_dict().items()})
    changed()
    model.to("meta")  # new Parameter objects put straight into _parameters: no registration hook fires
    changed()
    linear = nn.Linear(2, 2).to("meta")  # no buffers (replaced by a cast): the same parameters, address 0
    before = weights_fingerprint([linear])
    linear.to(torch.float64)
    assert weights_fingerprint([linear]) != before  # the dtype tells them apart


def test_eval_mode_restores_exactly_the_training_flags():
    model = make().train()
    model[1].eval()  # a submodule already in eval mode stays so
    before = [m.training for m in model.modules()]
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert [m.training for m in model.modules()] == before
    model[0] = nn.Linear(3, 4)  # a new submodule (training) is seen by the next call
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert model[0].training


def test_submodules_are_the_modules_set_each_once():
    model = make()
    shared = nn.Linear(2, 2)
    model.append(shared)
    model.append(nn.Sequential(shared))  # the same module twice in the tree
    model.register_module("absent", None)
    found = submodules(model)
    assert len(found) == len(set(map(id, found))) and set(map(id, found)) == set(map(id, model.modules()))


def test_first_parameter_is_the_first_of_parameters():
    model = make()
    assert first_parameter(model) is next(model.parameters())
    nested = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Identity(), nn.Sequential(nn.ReLU(), nn.Linear(2, 2))),
                           nn.Linear(3, 3))
    assert first_parameter(nested) is next(nested.parameters()) is nested[1][1][1].weight
    own = nn.Linear(2, 2)
    own.register_parameter("bias", None)  # a None entry is skipped
    own.register_parameter("early", None)
    own.child = nn.Linear(1, 1)  # a child's parameters come after the module's own
    assert first_parameter(own) is own.weight
    assert first_parameter(nn.Sequential(nn.ReLU(), nn.Sequential())) is None
