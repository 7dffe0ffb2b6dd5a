/* tp-keygen: make a CURVE key directory for authenticated tcp between
 * towerpack processes (tp-worker, tp-train --remote, tp-top). See
 * towerpack/security.h and docs/hardening.md. */
#include <stdio.h>
#include <string.h>
#include <towerpack/security.h>

int main(int argc, char **argv) {
    if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *out = argc == 2 ? stdout : stderr;
        fprintf(out,
            "usage: tp-keygen DIR\n"
            "Make DIR (mode 0700) with fresh CURVE certificates: server.key and\n"
            "server.key_secret for the side that binds, client.key and\n"
            "client.key_secret for the side that connects (secrets mode 0600).\n"
            "Copy DIR to every host of the run (keep it private) and give it to\n"
            "tp-worker, tp-train and tp-top with --curve DIR.\n");
        return argc == 2 ? 0 : 2;
    }
    if (tp_curve_keygen(argv[1]) < 0) {
        fprintf(stderr, "tp-keygen: %s\n", tp_last_error());
        return 1;
    }
    printf("tp-keygen: CURVE keys in %s (server.key[_secret], client.key[_secret])\n",
           argv[1]);
    return 0;
}
