# A premade estimator, imported from the package.
from tensorflow import estimator

classifier = estimator.LinearClassifier(feature_columns=[])
