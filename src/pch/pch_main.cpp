// Anchor for the executables' copy of the precompiled header (see src/CMakeLists.txt).
int main() { return 0; }
