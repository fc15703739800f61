// tdistrun: torchrun for tdist programs. See docs/launcher.md and `tdistrun --help`.
#include "tdist/launch/launcher.h"

int main(int argc, char** argv) {
  return tdist::launch::launcher_main(argc, argv);
}
