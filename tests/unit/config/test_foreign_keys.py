"""The Axolotl/TRL key catalogue (`plancc.config.foreign_keys`) classifies every key of the installed TRL's configs
once, and each of its Axolotl classes is disjoint."""

from __future__ import annotations

import dataclasses

from plancc.config import foreign_keys as fk

AXOLOTL_TOP = (fk.AXOLOTL_HONOURED, fk.AXOLOTL_TO_HONOUR, fk.AXOLOTL_UNSUPPORTED, fk.AXOLOTL_TRAINING_ONLY)
AXOLOTL_ENTRY = (fk.AXOLOTL_DATASET_HONOURED, fk.AXOLOTL_DATASET_TO_HONOUR, fk.AXOLOTL_DATASET_UNSUPPORTED)
TRL = (fk.TRL_HONOURED, fk.TRL_TO_HONOUR, fk.TRL_UNSUPPORTED, fk.TRL_TRAINING_ONLY)


def _once(classes) -> set[str]:
    seen: set[str] = set()
    for keys in classes:
        assert not seen & set(keys), sorted(seen & set(keys))
        seen |= set(keys)
    return seen


def test_every_trl_key_is_classified_once():
    import trl

    assert trl.__version__ == fk.TRL_VERSION
    sft = {f.name for c in (trl.SFTConfig, trl.ScriptArguments, trl.ModelConfig, trl.DatasetMixtureConfig)
           for f in dataclasses.fields(c)}
    classified = _once(TRL)
    assert sft <= classified, sorted(sft - classified)
    preference = {f.name for c in (trl.DPOConfig, trl.KTOConfig) for f in dataclasses.fields(c)} - sft
    assert preference == set(fk.TRL_PREFERENCE_ONLY)
    dpo, kto = ({f.name for f in dataclasses.fields(c)} - sft for c in (trl.DPOConfig, trl.KTOConfig))
    assert set(fk.TRL_KTO_ONLY) == kto - dpo and set(fk.TRL_DPO_AND_KTO) == kto & dpo


def test_axolotl_classes_are_disjoint_and_name_what_to_do():
    assert len(_once(AXOLOTL_TOP)) >= 390  # the whole schema of Axolotl 0.19.0
    _once(AXOLOTL_ENTRY)
    _once((fk.AXOLOTL_TYPES_HONOURED, fk.AXOLOTL_TYPES_TO_HONOUR, fk.AXOLOTL_TYPES_UNSUPPORTED))
    for table in (fk.AXOLOTL_UNSUPPORTED, fk.AXOLOTL_DATASET_UNSUPPORTED, fk.AXOLOTL_TYPES_UNSUPPORTED,
                  fk.TRL_UNSUPPORTED, fk.AXOLOTL_TO_HONOUR, fk.TRL_TO_HONOUR):
        assert all(isinstance(why, str) and why for why in table.values())
    assert "chat_template" in fk.AXOLOTL_TYPES_UNSUPPORTED["sharegpt"]
