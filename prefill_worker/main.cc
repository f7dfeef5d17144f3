// tandem-prefill-worker: an alias of `tandem-worker --role prefill`
// (worker/main.cc), kept for existing scripts.
#include "prefill_worker/prefill_role.h"

int main(int argc, char** argv) {
  return tandem::RunWorkerMain(argc, argv, tandem::prefill::PrefillRole(), "tandem-prefill-worker");
}
