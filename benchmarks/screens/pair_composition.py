"""Quick screen of a (shape, color) model pair: joint accuracy of every shape x colour conjunction (9),
plain, staged (the shape term alone from noise, then the sum from its samples, as the authors'
``blender_combine.py`` adds terms stage by stage) and, when both models have a null condition, guided;
read by the bundled classifier.

    python benchmarks/screens/pair_composition.py SHAPE_MODEL COLOR_MODEL [N] ['{"steps": 120}'] [plain,staged,guided]

A model is a model folder, a bundled name, or ``RUN_FOLDER:RECIPE`` (the EMA weights of a run's latest checkpoint).

The recipes of the screening runs are beside this file (``cebm train benchmarks/screens/X.toml --out runs/X``).
"""
import sys, torch, itertools, json
torch.set_num_threads(1)
from composable_ebm import compositional_accuracy, guided
from composable_ebm.persistence import load_model
from benchmarks._shapes import load_spec
sh, co = load_spec(sys.argv[1]), load_spec(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 32
over = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
clf = load_model("shapes-classifier").eval()
rows = []
forms = sys.argv[5].split(",") if len(sys.argv) > 5 else ["plain", "guided"]
for form in forms:
    if form == "guided" and not (sh.has_null_condition and co.has_null_condition):
        continue
    for s, c in itertools.product(("circle", "square", "triangle"), ("red", "green", "blue")):
        e = sh.condition(shape=s) + co.condition(color=c)
        if form == "guided":
            e = guided(e)
        if form == "staged":
            x = e.sample(n, x0=sh.condition(shape=s).sample(n, seed=1, **over), seed=2, form="plain", **over)
        else:
            x = e.sample(n, seed=1, form="plain", **over)
        sc = compositional_accuracy(x, clf, {"shape": s, "color": c})
        rows.append((form, s, c, sc.joint))
        print(form, s, c, f"joint {sc.joint:.3f}", {k: round(v, 2) for k, v in sc.per_attribute.items()}, flush=True)
    j = [r[3] for r in rows if r[0] == form]
    print(form, "MEAN", round(sum(j)/len(j), 3), "WORST", round(min(j), 3), flush=True)
