"""Writes the small tree-model fixtures of trees_test.go (issue #29):
trees_xgb.json / .ubj (XGBoost 3.2, 4 trees of depth 2), trees_lgb.txt
(LightGBM 4.7, 4 trees of 4 leaves), trees_sklearn.pkl (scikit-learn 1.9,
GradientBoostingClassifier of 4 trees of depth 2, pickle protocol 4) and
trees_sklearn.joblib (the same through joblib.dump). Run with the e2e venv:
    ~/.cache/ckptfs-venv/bin/python formats/testdata/gen_trees.py"""

import pickle
from pathlib import Path

import joblib
import lightgbm as lgb
import numpy as np
import xgboost as xgb
from sklearn.ensemble import GradientBoostingClassifier

here = Path(__file__).parent
rng = np.random.default_rng(29)
x = rng.standard_normal((200, 5)).astype(np.float32)
y = x[:, 0] + np.sin(x[:, 1])

bst = xgb.train({"max_depth": 2, "nthread": 1, "seed": 0}, xgb.DMatrix(x, label=y), num_boost_round=4)
bst.save_model(str(here / "trees_xgb.json"))
bst.save_model(str(here / "trees_xgb.ubj"))

lb = lgb.train({"num_leaves": 4, "verbose": -1, "num_threads": 1, "seed": 0, "deterministic": True},
               lgb.Dataset(x, label=y), num_boost_round=4)
lb.save_model(str(here / "trees_lgb.txt"))

clf = GradientBoostingClassifier(n_estimators=4, max_depth=2, random_state=0).fit(x, y > 0)
with open(here / "trees_sklearn.pkl", "wb") as f:
    pickle.dump(clf, f, protocol=4)
joblib.dump(clf, here / "trees_sklearn.joblib")
