// Compiled with the store area's flags: comm's private headers are not visible, so this
// include must fail (tests/layering/CMakeLists.txt expects exactly that error).
#include "comm/rendezvous.h"

int main() {
  return 0;
}
