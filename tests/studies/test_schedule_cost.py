"""`--dry-run`'s GPU-hours follow optimizer.schedule: a scheduled cell's steps are the method's on its share of them
and `none`'s on the rest."""

from __future__ import annotations

from tests.studies.test_trial_cost import _gpu_study


def test_a_scheduled_cells_hours_mix_the_methods_step_and_the_base_step(tmp_path, capsys):
    from studies.cli import main
    from studies.cost import CARD_FIGURES, REFERENCE_CARD, two_sig

    resnet = {"model.name": "resnet18", "model.cifar_stem": True}
    # Late-phase SAM from epoch 80 of 100 (0.2 of the steps), and SS-SAM at p = 0.5 with every other step (0.25).
    cells = {
        "late": {**resnet, "optimizer.method": "sam", "optimizer.schedule": {"start_fraction": 0.8}},
        "sparse": {**resnet, "optimizer.method": "sam", "optimizer.schedule": {"probability": 0.5, "every": 2}},
    }
    row = next(r for r in CARD_FIGURES if r.card == REFERENCE_CARD and r.model == "resnet18" and r.batch_size == 256)
    seen = (50_000 // 256) * 256
    for name, share in (("late", 0.2), ("sparse", 0.25)):
        path = _gpu_study(tmp_path, {name: cells[name]}, epochs=100, trials=10)
        assert main(["run", "--dry-run", "--address", "auto", path]) == 0
        out = capsys.readouterr().out
        hours = 10 * 100 * seen * (share / row.train_sam + (1 - share) / row.train_none) / 3600
        full, plain = (10 * 100 * seen / speed / 3600 for speed in (row.train_sam, row.train_none))
        assert two_sig(plain) != two_sig(hours) != two_sig(full)  # the case tells the three apart
        assert f"Estimated cost: {two_sig(hours)} GPU-hours" in out, (name, out)
