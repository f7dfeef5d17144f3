// tandem-decode-worker: an alias of `tandem-worker --role decode`
// (worker/main.cc), kept for existing scripts.
#include "decode_worker/decode_role.h"

int main(int argc, char** argv) {
  return tandem::RunWorkerMain(argc, argv, tandem::decode::DecodeRole(), "tandem-decode-worker");
}
