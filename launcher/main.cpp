// The tg command: everything lives in tg_launcher (run.h); main only hands over argv.
#include "launcher/run.h"

int main(int argc, char** argv) { return tg::launcher::tg_main(argc, argv); }
