/* placeholder, filled below */
#ifndef TOWERPACK_ACTOR_DATAFLOW_H
#define TOWERPACK_ACTOR_DATAFLOW_H
#endif
