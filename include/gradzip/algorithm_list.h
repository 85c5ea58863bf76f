// The one list of the algo= values: each one's Algorithm enumerator and its name, which the spec
// parser accepts, algorithm_name() prints, and the all-reduce path it selects reports in
// CollectiveStats::algorithm (the collectives' algorithm rows take their names from here).
//
// GRADZIP_ALGORITHMS(X) expands X(enumerator, name) once per value, in Algorithm's order (a new
// value goes at the end). Adding an algorithm: a line here, its row and file in collectives/
// (docs/architecture.md has the checklist).
#pragma once

#define GRADZIP_ALGORITHMS(X) \
  X(auto_select, "auto")      \
  X(ring, "ring")             \
  X(sra, "sra")               \
  X(sparse, "sparse")         \
  X(hier, "hier")             \
  X(rhd, "rhd")               \
  X(tree, "tree")
