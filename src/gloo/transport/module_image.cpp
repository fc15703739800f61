// The Gloo transport module's shared object, embedded byte for byte (see module_loader.cpp);
// TDIST_GLOO_MODULE_PATH (a string literal) is its path in the build tree, set by
// src/CMakeLists.txt.

asm(".section .rodata\n"
    ".balign 64\n"
    ".global tdist_gloo_module_image\n"
    ".hidden tdist_gloo_module_image\n"
    "tdist_gloo_module_image:\n"
    ".incbin \"" TDIST_GLOO_MODULE_PATH
    "\"\n"
    ".global tdist_gloo_module_image_end\n"
    ".hidden tdist_gloo_module_image_end\n"
    "tdist_gloo_module_image_end:\n"
    ".previous\n");
