package io.nopstream.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

/** Stands in for the bean of Apicurio's config-index build step, which is not published: no setting changes at run time. */
@ApplicationScoped
public class DynamicConfigBeans {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
