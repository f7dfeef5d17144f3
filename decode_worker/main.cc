// tandem-decode-worker: an alias of `tandem-worker --role decode`
// (worker/main.cc), kept for existing scripts.
#include "worker/all_roles.h"

int main(int argc, char** argv) {
  return tandem::RunWorkerBinary(argc, argv, tandem::v1::ROLE_DECODE, "tandem-decode-worker");
}
