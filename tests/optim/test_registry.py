"""Every registry entry builds and steps with every kind of base optimizer; the registry's errors say what to fix."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest
import torch

import optim
from optim import METHODS, Method, MethodSpec, StepOutput, create, method_names

NAMES = list(METHODS)


def test_registry_lists_every_method():
    # Derived, not pinned: the names are the entries of the spec modules, each once, in their declared order, so
    # that a new method is its module and its entry (a pinned copy here would be a third list to edit). An entry
    # lost or renamed shows instead in the diff of docs/methods.md's table, which is generated from the registry.
    from optim import _registry

    declared = [spec.name for module in _registry._MODULES for spec in module.SPECS]
    assert method_names() == tuple(declared) and len(set(declared)) == len(declared)
    assert "none" in declared  # the trial config's default method (trainables.config), the base optimizer alone
    for name, spec in METHODS.items():
        assert isinstance(spec, MethodSpec) and spec.name == name and spec.description
        assert spec.needs <= {"model", "num_samples", "num_classes"}
    with pytest.raises(TypeError):
        METHODS["x"] = METHODS["sam"]  # read-only


def test_defaults_come_from_the_class_signatures():
    sig = inspect.signature(optim.SAM.__init__).parameters
    assert METHODS["sam"].hparams == {
        "rho": sig["rho"].default,
        "p": sig["p"].default,
        "m": None,
        "gc": sig["gc"].default,
    }
    assert METHODS["asam"].hparams == {"rho": 0.5, "eta": 0.01, "m": None}
    assert METHODS["gsam"].hparams["alpha"] == inspect.signature(optim.GSAM.__init__).parameters["alpha"].default
    assert METHODS["looksam"].hparams == {"rho": 0.1, "k": 5, "alpha": 0.7}
    assert METHODS["saf"].hparams == {"lam": 0.3, "tau": 5.0, "e_tilde": 3, "e_start": 5}
    assert METHODS["mesa"].hparams == {"beta": 0.9998, "lam": 0.8, "tau": 5.0, "e_start": 5}
    assert METHODS["esam"].hparams == {"rho": 0.05, "beta": 0.6, "gamma": 0.5}
    assert METHODS["fsam"].hparams == {"rho": 0.05, "sigma": 1.0, "lmbda": 0.6}
    assert METHODS["msam"].hparams == {"rho": 0.3}


def _bases(model):
    import timm.optim

    yield "sgd", torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    yield "adamw-fused", torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    yield "adamw-foreach", torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    yield "timm", timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_steps_with_every_base_optimizer(name, helpers):
    for label, _ in _bases(helpers.make_model()):
        model = helpers.make_model()
        base = dict(_bases(model))[label]
        if label == "timm":  # timm puts 1-D tensors (biases, BN) in a no-weight-decay group
            assert {g["weight_decay"] for g in base.param_groups} == {0.0, 0.05}
        method = helpers.build(name, model, base)
        assert isinstance(method, Method) and method.name == name and method.base_optimizer is base
        before = [p.detach().clone() for p in model.parameters()]
        counter = []
        outs = helpers.run(method, model, 3, counter=counter)
        for out in outs:
            assert isinstance(out, StepOutput) and not out.skipped
            assert out.loss.ndim == 0 and not out.loss.requires_grad and torch.isfinite(out.loss)
            assert out.logits.shape == (8, helpers.NUM_CLASSES) and not out.logits.requires_grad
        assert all(p.grad is None for p in model.parameters())  # the method clears the grads
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), (name, label)
        spec = METHODS[name]
        if name in ("sam", "asam", "gsam", "esam", "fsam"):
            assert all(o.perturbed_loss is not None and o.rho > 0 for o in outs)
        if name in ("none", "saf", "mesa", "msam"):
            assert all(o.perturbed_loss is None and o.rho is None for o in outs)
        if name in ("saf", "mesa"):
            assert outs[0].extra_loss is None and outs[2].extra_loss is not None  # active when epoch > e_start=1
        # What the entry says three steps at its small settings give (ESAM with gamma < 1: pass 1, the no-grad
        # selection forward, pass 2 on the selected half; LookSAM with k = 2: SAM on steps 0 and 2).
        assert method.passes_per_step == pytest.approx(spec.small.passes_per_step)
        assert len(counter) == spec.small.forwards
        assert method.extra_state_bytes() >= 0


def test_extra_state_bytes(helpers):
    model = helpers.make_model()
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    assert helpers.build("none", model).extra_state_bytes() == 0
    assert helpers.build("sam", model).extra_state_bytes() == nbytes
    assert helpers.build("gsam", model).extra_state_bytes() == 2 * nbytes
    saf = helpers.build("saf", model, hparams={"e_tilde": 3, "e_start": 5})
    assert saf.regulariser.buffer_bytes == 4 * helpers.NUM_SAMPLES * helpers.NUM_CLASSES * 2
    assert saf.extra_state_bytes() == saf.regulariser.buffer_bytes
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert helpers.build("mesa", model).extra_state_bytes() == nbytes + buffers


def test_unknown_name_lists_valid_names_and_closest():
    base = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(
        ValueError,
        match=r"unknown method 'gasm'.*none, sam, asam, gsam, looksam, saf, mesa, esam, fsam, msam.*did you mean 'gsam'",
    ):
        create("gasm", base)


def test_every_name_one_typo_away_is_suggested():
    # A swap of neighbours is one typo, as a letter left out is: 'gasm' may be GSAM or GAM, so both are named.
    base = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match=r"did you mean 'gsam' or 'gam'\?$"):
        create("gasm", base)
    with pytest.raises(ValueError, match=r"did you mean 'rwp'\?$"):
        create("rpw", base)


def test_unknown_hparam_lists_accepted_ones(helpers):
    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"'sam' does not take hparam\(s\) alpha.*accepts: rho=0.05, p=2"):
        create("sam", base, model=model, alpha=0.1)
    with pytest.raises(ValueError, match=r"'none' does not take hparam\(s\) rho"):
        create("none", base, model=model, rho=0.1)


def test_missing_context_is_named(helpers):
    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="'saf' needs num_classes, num_samples"):
        create("saf", base, model=model)
    with pytest.raises(ValueError, match="'sam' needs model"):
        create("sam", base)


BAD = [
    ("sam", {"rho": -0.1}, "rho", "0 <= rho"),
    ("sam", {"rho": math.nan}, "rho", "0 <= rho"),
    ("sam", {"p": 3}, "p", "p == 2 or p == float"),
    ("asam", {"eta": -1.0}, "eta", "0 <= eta"),
    ("gsam", {"alpha": -0.5}, "alpha", "0 <= alpha"),
    ("gsam", {"rho_max": 0.01, "rho_min": 0.1}, "rho_min", "rho_min <= rho_max"),
    ("gsam", {"lr_max": 0.01, "lr_min": 0.1}, "lr_max", "lr_max >= lr_min"),
    ("looksam", {"k": 0}, "k", "k >= 1"),
    ("looksam", {"k": 2.5}, "k", "k >= 1"),
    ("looksam", {"alpha": -1}, "alpha", "alpha >= 0"),
    ("saf", {"e_tilde": 3, "e_start": 2}, "e_start", "e_start >= e_tilde"),
    ("saf", {"tau": 0.0}, "tau", "tau > 0"),
    ("saf", {"lam": -1.0}, "lam", "0 <= lam"),
    ("saf", {"e_tilde": 0}, "e_tilde", "e_tilde >= 1"),
    ("mesa", {"beta": 1.0}, "beta", "0 <= beta < 1"),
    ("mesa", {"beta": -0.1}, "beta", "0 <= beta < 1"),
    ("mesa", {"tau": -1.0}, "tau", "tau > 0"),
    ("sam", {"m": 0}, "m", "m >= 1"),
    ("sam", {"m": 2.5}, "m", "m >= 1"),
    ("esam", {"beta": 0.0}, "beta", "0 < beta <= 1"),
    ("esam", {"gamma": 1.5}, "gamma", "0 < gamma <= 1"),
    ("fsam", {"sigma": -1.0}, "sigma", "0 <= sigma"),
    ("fsam", {"lmbda": 1.0}, "lmbda", "0 <= lmbda < 1"),
    ("fsam", {"sigma": 3.0}, "sigma", "sigma * (1 - lmbda) < 1"),
    ("fsam", {"sigma": 1.0, "lmbda": 0.0}, "sigma", "sigma * (1 - lmbda) < 1"),
    ("msam", {"rho": -0.1}, "rho", "0 <= rho"),
]


@pytest.mark.parametrize("name,hp,field,rule", BAD, ids=[f"{b[0]}-{b[2]}-{list(b[1].values())[-1]}" for b in BAD])
def test_bad_hparams_name_the_field_rule_value_and_fix(name, hp, field, rule, helpers):
    model = helpers.make_model()
    with pytest.raises(ValueError) as err:
        helpers.build(name, model, hparams=hp)
    msg = str(err.value)
    assert msg.startswith(f"{field} must satisfy") and rule in msg and f"{field}=" in msg and "; " in msg, msg


def test_bad_grad_clip(helpers):
    with pytest.raises(ValueError, match="grad_clip must satisfy 0 < grad_clip"):
        helpers.build("sam", helpers.make_model(), grad_clip=0.0)


def test_sam_accepts_p_inf(helpers):
    assert helpers.build("sam", helpers.make_model(), hparams={"p": float("inf")}).p == math.inf
    assert helpers.build("sam", helpers.make_model(), hparams={"p": "inf"}).p == math.inf


def test_optim_is_pure_pytorch():
    src = Path(optim.__file__).parent
    files = sorted(src.glob("*.py"))
    assert len(files) >= 7
    for f in files:
        text = f.read_text()
        assert not re.search(r"^\s*(import|from)\s+(ray|optuna|mlflow)\b", text, re.MULTILINE), f
        assert text.startswith('"""'), f"{f.name} must open with a one-line docstring"
    assert set(optim.__all__) >= {
        "SAM",
        "GSAM",
        "LookSAM",
        "SAF",
        "MESA",
        "create",
        "trajectory_kl",
        "METHODS",
        "MethodSpec",
        "method_names",
        "Method",
        "StepKeywords",
        "StepOutput",
    }


def test_readme_methods_table_is_the_registry():
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("update_readme", root / "docs" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (root / "docs" / "methods.md").read_text()  # the README links it
    block = readme.split(module.METHODS_BEGIN, 1)[1].split(module.METHODS_END, 1)[0].strip()
    assert block == module.methods_table(), f"docs/methods.md's methods table is stale: run {module.REGENERATE}"
    assert all(f"| `{name}` |" in block for name in METHODS)


def test_every_method_module_is_collected():
    # A module that declares SPECS but is missing from the registry's list would leave its method untested.
    import importlib
    import pkgutil

    from optim import _registry

    declaring = []
    for info in pkgutil.iter_modules(optim.__path__):
        module = importlib.import_module(f"optim.{info.name}")
        if hasattr(module, "SPECS"):
            declaring.append(module)
            assert module in _registry._MODULES, f"optim.{info.name} declares SPECS but is not in _registry._MODULES"
    assert {s.name for m in declaring for s in m.SPECS} == set(METHODS)


def test_each_builder_reads_its_name_and_knobs_from_its_entry():
    """The classes and factories name no method themselves: ``@registered`` gives each its entry (SAM, built by two
    entries, picks by ``adaptive``), and a class or factory no entry names, or two name, is refused."""
    from optim._specs import registered

    for name, spec in METHODS.items():
        target = getattr(spec.build, "func", spec.build)
        if name in ("sam", "asam"):
            assert not hasattr(target, "spec")
            continue
        assert target.spec is spec, name
        if isinstance(target, type):
            assert target.name == name

    class Unnamed:
        pass

    with pytest.raises(TypeError, match=r"no entry in optim._specs.SPECS names it as builder, where exactly one must"):
        registered(Unnamed)
    with pytest.raises(TypeError, match=r"^@registered optim._sam.SAM: 'sam', 'asam' in optim._specs.SPECS"):
        registered(optim.SAM)


def test_an_entrys_small_run_sets_only_its_own_knobs():
    from optim._knobs import Knob, SmallRun, method_spec

    with pytest.raises(TypeError, match=r"^method 'x': small.hparams sets \['rh'\], which are not among its knobs"):
        method_spec("x", description="", builder="", knobs=(Knob("rho", 0.1),), small=SmallRun({"rh": 0.2}))
    with pytest.raises(TypeError, match=r"^method 'x': small.base_exactly sets \['r'\]"):
        method_spec("x", description="", builder="", knobs=(Knob("rho", 0.1),), small=SmallRun(base_exactly={"r": 0}))


@pytest.mark.parametrize("name", NAMES)
def test_every_small_run_passes_its_rules(name):
    spec = METHODS[name]
    spec.check_knobs(**{**spec.hparams, **spec.small.hparams})
    if spec.small.base_exactly is not None:
        spec.check_knobs(**{**spec.hparams, **spec.small.hparams, **spec.small.base_exactly})
    assert spec.step_cost is None or 0 < spec.step_cost <= 1


# ----------------------------------------------------------------------------- the shared keywords' one home
SHARED = [p for p in inspect.signature(Method.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY]
SHARED_NAMES = [p.name for p in SHARED]


def _builder_functions(build) -> list:
    """The functions a registry entry's builder runs before ``Method.__init__``: a factory itself, or each ``__init__``
    a Method subclass defines on the way down to Method's."""
    target = getattr(build, "func", build)  # functools.partial (asam)
    if not isinstance(target, type):
        return [target]
    assert issubclass(target, Method)
    return [c.__dict__["__init__"] for c in target.__mro__[: target.__mro__.index(Method)] if "__init__" in c.__dict__]


def test_step_keywords_are_method_inits_keywords():
    from optim._knobs import CONTEXT

    assert (
        SHARED_NAMES
        == list(optim.StepKeywords.__annotations__)
        == ["model", "grad_clip", "scaler", "global_perturbation", "accumulate", "scope"]
    )
    assert set(CONTEXT) == {"num_samples", "num_classes", *SHARED_NAMES}
    assert list(optim._knobs.SHARED) == SHARED_NAMES  # what MethodSpec.accepts reads, without importing the classes
    # create() and check_hparams() name them too (the registry imports no torch, so it cannot read Method's
    # defaults): the same defaults, held here.
    made = inspect.signature(create).parameters
    assert [made[n].default for n in SHARED_NAMES] == [p.default for p in SHARED]
    checked = inspect.signature(optim.check_hparams).parameters["global_perturbation"]
    assert checked.default == made["global_perturbation"].default


def _names_itself(fn) -> set[str]:
    """The shared keywords ``fn`` declares as its own parameters (each would carry a default of its own)."""
    code = fn.__code__
    return set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]) & set(SHARED_NAMES)


def test_no_method_class_declares_a_shared_keyword():
    # Every Method subclass in optim, registered or not (TwoPass, Regularised behind the saf/mesa factories).
    for spec in METHODS.values():
        spec.build  # noqa: B018 - imports the entry's module, so its classes exist
    classes, todo = [], [Method]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in classes:
                classes.append(sub)
                todo.append(sub)
    classes = [c for c in classes if c.__module__.startswith("optim.")]
    assert {"TwoPass", "SAM", "Regularised", "MSAM", "BaseOnly"} <= {c.__name__ for c in classes}
    for cls in classes:
        init = cls.__dict__.get("__init__")
        if init is not None:
            assert not _names_itself(init), f"{cls.__name__}.__init__ names {sorted(_names_itself(init))} itself"
            params = inspect.signature(cls).parameters
            assert [p for p in params.values() if p.name in SHARED_NAMES] == SHARED, cls


@pytest.mark.parametrize("name", NAMES)
def test_every_method_takes_the_shared_keywords_from_method_alone(name, helpers):
    """No builder names a shared keyword itself (so none has a default or a check of its own): each passes
    ``**common`` on to ``Method.__init__``, and a class's signature shows them with Method's defaults."""
    spec = METHODS[name]
    for fn in _builder_functions(spec.build):
        assert not _names_itself(fn), f"{fn.__qualname__} names {sorted(_names_itself(fn))} itself"
        assert fn.__code__.co_flags & inspect.CO_VARKEYWORDS, f"{fn.__qualname__} does not pass **common on"
    target = getattr(spec.build, "func", spec.build)
    if isinstance(target, type):  # help() shows the class with Method's keywords, defaults and all
        params = inspect.signature(target).parameters
        assert [p for p in params.values() if p.name in SHARED_NAMES] == SHARED
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert set(SHARED_NAMES) <= spec.accepts()

    # The keywords reach Method.__init__ unchanged, and its checks are the ones that answer.
    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    context = {"num_samples": helpers.NUM_SAMPLES, "num_classes": helpers.NUM_CLASSES}
    context = {k: v for k, v in context.items() if k in spec.accepts()}
    given = {
        "model": model,
        "grad_clip": 0.5,
        "scaler": None,
        "global_perturbation": True,
        "accumulate": 2,
        "scope": "all",
    }
    method = spec.build(base, **spec.hparams, **context, **given)
    assert {k: getattr(method, k) for k in SHARED_NAMES} == given
    with pytest.raises(ValueError, match=r"^accumulate must satisfy accumulate >= 1 .* but got accumulate=0; "):
        spec.build(base, **spec.hparams, **context, **{**given, "accumulate": 0})
    with pytest.raises(TypeError, match="grad_clp"):
        spec.build(base, **spec.hparams, **context, model=model, grad_clp=1.0)
