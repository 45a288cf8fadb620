from vramlab.lessons.predict import given, guess


def test_an_empty_prediction_says_so_and_a_given_one_is_formatted():
    assert guess(None) == "no prediction given"
    assert guess(None, none="") == ""
    assert guess(16, "{}x") == "predicted 16x"
    assert guess(2.0, lambda v: f"{v:.2f} bytes") == "predicted 2.00 bytes"
    assert given(0) and not given(None)
