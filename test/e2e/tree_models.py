"""Warm-started tree models for the tree-dedup tests (issue #29): each row
trains 10 rounds of +50 trees on 4,000 samples x 20 features and saves the
model after every round, the way its library writes it.

Run as a script (python tree_models.py ROW DIR) it writes the 10 saves into
DIR, for measuring outside pytest."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

ROWS = ("xgboost-json", "xgboost-ubj", "sklearn-joblib", "sklearn-pickle", "lightgbm-text")
ROUNDS, TREES_PER_ROUND = 10, 50


def data(seed: int = 0, n: int = 4000, d: int = 20):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = x[:, 0] * 2 + np.sin(x[:, 1]) + rng.standard_normal(n) * 0.1
    return x, y


def warm_start_saves(row: str, out: Path):
    """Yields (path, predict) per round: the file just saved and a function that
    loads a saved file with the library and predicts x (to compare with the
    model that saved it, whose predictions are predict's second argument)."""
    x, y = data()
    if row.startswith("xgboost"):
        import xgboost as xgb
        ext = row.split("-")[1]
        dtrain = xgb.DMatrix(x, label=y)
        params = {"max_depth": 6, "eta": 0.1, "objective": "reg:squarederror", "nthread": 2, "seed": 0}
        bst = None
        for r in range(ROUNDS):
            bst = xgb.train(params, dtrain, num_boost_round=TREES_PER_ROUND, xgb_model=bst)
            path = out / f"round-{r:02d}.{ext}"
            bst.save_model(str(path))
            yield path, bst.predict(dtrain), lambda p: xgb.Booster(model_file=str(p)).predict(xgb.DMatrix(x))
    elif row.startswith("sklearn"):
        import joblib
        from sklearn.ensemble import GradientBoostingClassifier
        labels = (y > np.median(y)).astype(np.int64)
        clf = GradientBoostingClassifier(n_estimators=0, warm_start=True, random_state=0)
        for r in range(ROUNDS):
            clf.set_params(n_estimators=TREES_PER_ROUND * (r + 1))
            clf.fit(x, labels)
            if row == "sklearn-joblib":
                path = out / f"round-{r:02d}.joblib"
                joblib.dump(clf, path)
                load = joblib.load
            else:
                path = out / f"round-{r:02d}.pkl"
                with open(path, "wb") as f:
                    pickle.dump(clf, f)

                def load(p):
                    with open(p, "rb") as f:
                        return pickle.load(f)
            yield path, clf.predict_proba(x), lambda p, load=load: load(p).predict_proba(x)
    elif row == "lightgbm-text":
        import lightgbm as lgb
        ds = lgb.Dataset(x, label=y, free_raw_data=False)
        params = {"objective": "regression", "num_leaves": 31, "learning_rate": 0.1, "verbose": -1,
                  "num_threads": 2, "seed": 0, "deterministic": True}
        bst = None
        for r in range(ROUNDS):
            bst = lgb.train(params, ds, num_boost_round=TREES_PER_ROUND, init_model=bst,
                            keep_training_booster=True)
            path = out / f"round-{r:02d}.txt"
            bst.save_model(str(path))
            yield path, bst.predict(x), lambda p: lgb.Booster(model_file=str(p)).predict(x)
    else:
        raise ValueError(f"unknown row {row!r}")


if __name__ == "__main__":
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for path, want, load in warm_start_saves(sys.argv[1], out):
        got = load(path)
        assert np.array_equal(got, want), path
        print(path, path.stat().st_size)
