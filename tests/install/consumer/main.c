/* An outside program using the installed towerpack: builds a datapoint,
 * sends it through the wire format and checks what comes back. */
#include <stdio.h>
#include <towerpack/towerpack.h>

int main(void) {
    int64_t shape[] = {4};
    tp_datapoint_t *dp = tp_datapoint_new(1), *back = NULL;
    if (tp_tensor_init_zero(tp_datapoint_get(dp, 0), TP_FLOAT32, 1, shape) != TP_OK)
        return 1;
    ((float *)tp_datapoint_get(dp, 0)->data)[2] = 1.5f;
    tp_wire_msg_t *msg = tp_wire_msg_new();
    if (tp_wire_encode(&dp, NULL, msg) != TP_OK ||
        tp_wire_decode(msg, NULL, &back) != TP_OK) {
        fprintf(stderr, "consumer: %s\n", tp_last_error());
        return 1;
    }
    float v = ((float *)tp_datapoint_get(back, 0)->data)[2];
    tp_datapoint_destroy(&back);
    tp_wire_msg_destroy(&msg);
    printf("towerpack %s consumer ok (%g)\n", TP_VERSION_STRING, v);
    return v == 1.5f ? 0 : 1;
}
